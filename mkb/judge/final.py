"""grade_final(): the grading that is an attempt's result, in several fresh processes (DESIGN §5, issue #27).

Feedback gradings (an agent's submit tool, `mkb verify`) run once, in one set of fresh processes
(details.grading.mode "single"). A final grading runs `processes` whole gradings back to back, each
in its own fresh referee, candidate and eager processes (the next one's started ahead as spares),
and summarises their medians (robust.py); details.grading lists every process's figures. A process
that does not pass ends the final grading with its record. The eager baseline is either handed in
(stored for this problem, GPU and environment: no eager calls are made) or measured by the same
processes and returned in details.eager for the caller to store.
"""

from __future__ import annotations

import hashlib
import json
import time
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from mkb import environment
from mkb.errors import MkbError
from mkb.judge import robust
from mkb.judge.grading import grade
from mkb.records import Dsl, JudgeRecord, ProblemInfo
from mkb.settings import Settings


def grade_final(problem: ProblemInfo, kernel_path: str | Path, dsl: Dsl | str, *, device: str,
                timing: str = "paper", settings: Settings | None = None, scale: str = "full",
                visible_devices: str | None = None, timeout_s: float | None = None,
                processes: int = robust.DEFAULT_PROCESSES, summary: str = robust.DEFAULT_SUMMARY,
                baseline: robust.Baseline | None = None, gpu: str | None = None,
                now: Callable[[], float] = time.monotonic) -> JudgeRecord:
    """Grade kernel_path in `processes` fresh sets of judge processes and summarise them (robust.combine).

    gpu names the device for the baseline's fingerprint (the judge's GPU model); baseline, when given, is
    the stored eager figure for exactly that fingerprint.

    Raises:
        MkbError: processes < 1, an unknown summary, or what grade() raises.
    """
    if processes < 1:
        raise MkbError(f"a final grading needs at least 1 process, got {processes}.")
    if summary not in robust.SUMMARIES:
        raise MkbError(f"unknown summary '{summary}'. Use one of {', '.join(robust.SUMMARIES)}.")
    records = []
    for _ in range(processes):
        record = grade(problem, kernel_path, dsl, device=device, timing=timing, settings=settings, scale=scale,
                       visible_devices=visible_devices, timeout_s=timeout_s, baseline=baseline, now=now)
        records.append(record)
        if not record.passed or device != "cuda":  # the first failure is the result; CPU gradings time nothing
            break
    fingerprint = baseline.fingerprint if baseline else baseline_fingerprint(problem, gpu or "", timing, scale)[0]
    return robust.combine(records, summary, baseline, fingerprint)


def baseline_fingerprint(problem: ProblemInfo, gpu: str, timing: str, scale: str) -> tuple[str, dict[str, Any]]:
    """sha256 of what an eager baseline depends on, and those parts: the problem file, the GPU model, the timing
    mode and scale, torch (with its CUDA build), Python, the driver and the timing method."""
    versions = environment.versions()
    parts = {"problem": problem.id, "problem_fingerprint": problem.fingerprint, "gpu": gpu, "timing": timing,
             "scale": scale, "torch": versions.get("torch"), "python": versions.get("python"),
             "driver": _driver(), "method": robust.TIMING_METHOD}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest(), parts


@lru_cache(maxsize=1)
def _driver() -> str | None:
    return environment.driver_version()
