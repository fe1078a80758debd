"""Calibration (issue #27): a kernel's final grading repeated, and how far the repeats came apart.

`mkb calibrate` grades the shipped solutions (or any kernel) `repeats` times in the final-grading mode
(several fresh processes each, the stored eager baseline) and stores each variant's spread, max/min - 1
of its speedups, as its noise floor (table noise_floors); the report compares paired ratios with
max(delta, the problem's floor) beside the paper's delta. `mkb bench judge --final` runs the same
repetitions and stores nothing. Each row also says whether the goals of issue #27 were met: a spread of
at most 2 % for kernels of at least 50 us and 5 % for all, and a final grading of a kernel of at most
1 ms adding at most 30 s to a single-process grading.
"""

from __future__ import annotations

import hashlib
import statistics
from dataclasses import dataclass
from pathlib import Path

from mkb.errors import MkbError
from mkb.judge import robust
from mkb.problems import catalog_for, resolve
from mkb.protocol.attempts import solution_path
from mkb.protocol.judging import Judging
from mkb.records import DSLS, Dsl, JudgeRecord, ProblemInfo
from mkb.settings import Settings
from mkb.store import NoiseFloor, now

SPREAD_GOAL, SHORT_SPREAD_GOAL, SHORT_KERNEL_MS = 0.02, 0.05, 0.05
"""Issue #27: identical gradings' speedups within 2 % for kernels of at least 50 us, within 5 % for all."""
ADDED_GOAL_S, ADDED_GOAL_KERNEL_MS = 30.0, 1.0
"""Issue #27: a final grading of a kernel of at most 1 ms adds at most 30 s to a single-process grading."""


@dataclass(frozen=True)
class Variant:
    """A kernel to calibrate: a problem, its DSL and the kernel file (a shipped solution by default)."""

    problem: ProblemInfo
    dsl: Dsl
    kernel: Path


def variants(settings: Settings, specs: list[str], dsls: list[str] | None = None) -> list[Variant]:
    """Variants from specs 'p25' (its shipped solutions), 'p25:cutedsl' or 'p25:cutedsl:path/kernel.py'; no specs:
    every problem with a shipped solution. dsls limits the DSLs of specs that name none.

    Raises:
        MkbError: an unknown problem or DSL, or a variant without a shipped solution and no kernel given.
    """
    catalog = catalog_for(settings.problems_dir)
    wanted = [Dsl(d) for d in dsls] if dsls else list(DSLS)
    if not specs:
        return [Variant(p, d, solution_path(settings.solutions_path, p, d)) for p in catalog for d in wanted
                if solution_path(settings.solutions_path, p, d).exists()]
    found = []
    for spec in specs:
        problem_id, _, rest = spec.partition(":")
        dsl_name, _, kernel = rest.partition(":")
        problem = resolve(problem_id, catalog)
        if dsl_name and dsl_name not in DSLS:
            raise MkbError(f"unknown DSL '{dsl_name}' in '{spec}'. Use {' or '.join(DSLS)}, e.g. {problem.id}:tirx.")
        for dsl in [Dsl(dsl_name)] if dsl_name else wanted:
            path = Path(kernel) if kernel else solution_path(settings.solutions_path, problem, dsl)
            if not path.is_file():
                raise MkbError(f"no kernel for {problem.id} {dsl}: {path} does not exist. Give one as "
                               f"{problem.id}:{dsl}:path/to/kernel.py.")
            found.append(Variant(problem, dsl, path))
    return found


def repeat(judging: Judging, variant: Variant, repeats: int, slot: str) -> list[JudgeRecord]:
    """`repeats` final gradings of one variant, one after another."""
    return [judging.final(variant.problem, str(variant.kernel), variant.dsl, device_slot=slot,
                          measured_by=f"mkb calibrate ({variant.problem.id} {variant.dsl})") for _ in range(repeats)]


def summarize(variant: Variant, records: list[JudgeRecord]) -> dict:
    """One row: what passed, the figures of every repeat, the spread and its goal, what a final grading cost."""
    passed = [r for r in records if r.passed]
    row = {"problem": variant.problem.id, "dsl": str(variant.dsl), "kernel": str(variant.kernel),
           "passed": f"{len(passed)}/{len(records)}", "statuses": [str(r.status) for r in records],
           "messages": [r.message for r in records if not r.passed]}
    if not passed:
        return row
    speedups, kernel_each = [r.speedup for r in passed], [r.kernel_ms for r in passed]
    grading = [r.details.get("grading") or {} for r in passed]
    per_process = [[p for p in g.get("per_process", [])] for g in grading]
    walls = [p["wall_s"] for ps in per_process for p in ps]
    finals = [r.wall_s for r in passed]
    kernel_ms, spread = statistics.median(kernel_each), robust.spread(speedups)
    goal = SPREAD_GOAL if kernel_ms >= SHORT_KERNEL_MS else SHORT_SPREAD_GOAL
    added = statistics.median(finals) - (statistics.median(walls) if walls else 0.0)
    row.update(kernel_ms=kernel_ms, eager_ms=passed[-1].eager_ms, speedup_median=statistics.median(speedups),
               spread_pct=100 * spread, spread_goal_pct=100 * goal, spread_met=spread <= goal,
               speedups=speedups, kernel_ms_each=kernel_each,
               process_kernel_ms=[[p["kernel_ms"] for p in ps] for ps in per_process],
               process_return_ms=[[p["return_ms"] for p in ps] for ps in per_process],
               device_ms=statistics.median(r.details["device_ms"] for r in passed if r.details.get("device_ms"))
               if any(r.details.get("device_ms") for r in passed) else None,
               processes=grading[0].get("processes"), summary=grading[0].get("summary"),
               eager_sources=[(r.details.get("eager") or {}).get("source") for r in passed],
               final_s=statistics.median(finals), process_s=statistics.median(walls) if walls else None,
               added_s=added, added_met=None if kernel_ms > ADDED_GOAL_KERNEL_MS else added <= ADDED_GOAL_S,
               gpu=(passed[0].details.get("gpu") or {}).get("name"))
    return row


def floor(variant: Variant, records: list[JudgeRecord], gpu: str, timing: str) -> NoiseFloor | None:
    """The variant's noise floor row, or None unless every repeat passed (a failure is no measure of noise)."""
    if not records or not all(r.passed for r in records):
        return None
    grading = records[0].details.get("grading") or {}
    speedups = [r.speedup for r in records]
    return NoiseFloor(problem_id=variant.problem.id, dsl=variant.dsl, gpu=gpu, timing=timing,
                      kernel=str(variant.kernel), kernel_sha256=hashlib.sha256(variant.kernel.read_bytes()).hexdigest(),
                      repeats=len(records), processes=int(grading.get("processes") or 1),
                      summary=str(grading.get("summary") or robust.DEFAULT_SUMMARY), speedups=speedups,
                      kernel_ms_each=[r.kernel_ms for r in records], spread=robust.spread(speedups),
                      created_at=now())
