"""`mkb bench`: benchmarks of mkb itself (not tests): judge overhead and timing repeatability."""

from __future__ import annotations

import statistics
from pathlib import Path

import click

from mkb.cli import comma_separated, emit, output_options, settings_from
from mkb.errors import MkbError
from mkb.records import DSLS

DEFAULT_KERNEL = Path(__file__).resolve().parents[2] / "tests" / "kernels" / "gpu_cutedsl_p28.py"


@click.group(name="bench")
def bench():
    """Benchmarks of mkb's own machinery (they need a GPU).

    Example:

    \b
        mkb bench judge p28 --dsl cutedsl tests/kernels/gpu_cutedsl_p28.py --json
    """


@bench.command(name="judge")
@click.argument("problem_id", default="p28")
@click.argument("kernel", type=click.Path(dir_okay=False), default=str(DEFAULT_KERNEL))
@click.option("--dsl", type=click.Choice([str(d) for d in DSLS]), default="cutedsl", show_default=True)
@click.option("--repeats", type=int, default=5, show_default=True, help="Gradings per timing mode.")
@click.option("--mode", "modes", multiple=True, callback=comma_separated(["paper", "flushed"]),
              help="Timing mode(s) to benchmark: paper, flushed (repeated or comma-separated; default both).")
@output_options
@click.pass_context
def bench_judge(ctx, problem_id, kernel, dsl, repeats, modes=(), json_=False, csv_=False):
    """Judge overhead per evaluation and the spread of speedup over repeated gradings (paper and flushed).

    Overhead is the grading's wall time minus the kernel's own calls (solve calls x kernel_ms).
    Spread is (max - min) / median of the speedups of `repeats` gradings of the same kernel.
    Gradings run back to back, as in an agent's session: each finds the judge processes that the
    previous one started ahead (spare_used), except the first, whose figure is cold_overhead_s.
    Where the overhead goes: median seconds until the judge's processes were ready (startup_s) and
    per grading phase and per step of the correctness draws (phases_s, correctness_s, in --json).

    Example:

    \b
        mkb bench judge --json
    """
    from mkb.environment import resolve_device
    from mkb.judge import grade
    from mkb.problems import catalog_for, resolve

    settings = settings_from(ctx)
    if resolve_device(settings).kind != "cuda":
        raise MkbError("mkb bench judge needs a CUDA GPU and none is visible here; run it on the GPU machine.")
    problem = resolve(problem_id, catalog_for(settings.problems_dir))
    rows = []
    for mode in modes or ("paper", "flushed"):
        records = [grade(problem, kernel, dsl, device="cuda", timing=mode, settings=settings) for _ in range(repeats)]
        rows.append(summarize(mode, records))
    emit(rows, json_, csv_, title=f"judge benchmark: {problem.id} {dsl} {Path(kernel).name}",
         columns=["mode", "passed", "kernel_ms", "speedup_median", "spread_pct", "overhead_s", "cold_overhead_s",
                  "spare_used", "pinned", "startup_s", "wall_s"])


def summarize(mode: str, records: list) -> dict:
    """One row: pass count, medians, speedup spread and overhead per evaluation, and where it ran."""
    passed = [r for r in records if r.passed]
    first = records[0].details if records else {}
    row = {"mode": mode, "passed": f"{len(passed)}/{len(records)}",
           "statuses": [str(r.status) for r in records], "messages": [r.message for r in records if not r.passed],
           "gpu": (first.get("gpu") or {}).get("name"), "environment": first.get("environment")}
    if not passed:
        return row
    speedups = [r.speedup for r in passed]
    overheads = [overhead_s(r) for r in passed]
    median = statistics.median(speedups)
    row.update(kernel_ms=statistics.median(r.kernel_ms for r in passed), speedup_median=median,
               spread_pct=100 * (max(speedups) - min(speedups)) / median, speedups=speedups,
               overhead_s=statistics.median(overheads), overheads_s=overheads,
               kernel_ms_each=[r.kernel_ms for r in passed], eager_ms_each=[r.eager_ms for r in passed],
               wall_s=statistics.median(r.wall_s for r in passed))
    placed = [(r.details.get("timing") or {}).get("cpus") or {} for r in passed]
    row["pinned"] = f"{sum(p.get('timed') is not None for p in placed)}/{len(passed)}"
    warm = [r for r in passed if (r.details.get("spare") or {}).get("used")]
    row["spare_used"] = f"{len(warm)}/{len(passed)}"
    if cold := [overhead_s(r) for r in passed if r not in warm]:  # processes started for this grading
        row["cold_overhead_s"] = statistics.median(cold)
    starts = [r.details["processes_start_s"] for r in passed if r.details.get("processes_start_s") is not None]
    if starts:
        row["startup_s"] = statistics.median(starts)
    for key in ("phases_s", "correctness_s"):  # the grading's phases; the steps of its correctness draws
        names = sorted({name for r in passed for name in r.details.get(key, {})})
        row[key] = {name: statistics.median(r.details[key].get(name, 0.0) for r in passed if key in r.details)
                    for name in names}
    return row


def overhead_s(record) -> float:
    """A grading's wall time minus its kernel's own calls (solve calls x kernel_ms)."""
    return record.wall_s - record.details.get("solve_calls", 0) * record.kernel_ms / 1e3


def register(main):
    main.add_command(bench)
