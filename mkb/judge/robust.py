"""Final gradings: one median per fresh process, summarised so that no single process's host speed sways it.

On the lent H200 (a KVM guest) the host launch path of a process runs at one of two speeds, fixed for
that process's life (docs/judge.md, fifth session): a kernel of tens of microseconds times 1.1-1.7x
slower in a "slow" process, whatever the judge does inside it. A final grading therefore grades the
kernel in several fresh processes (each a whole grading: draws, checks, 50 timed calls) and reports
the smallest of their medians (`min`, the default) or their median (`median`). docs/judge.md
("Final gradings") shows, on the H200's measured per-process figures, why min is the default: a
final grading lands on the slow level only when every one of its processes did.

The eager baseline is the same kind of summary over fresh trusted processes, measured once per
(problem, GPU, environment) and stored (`Baseline`); gradings that are handed one time no eager calls.
Pure functions on JudgeRecords: no processes, no torch.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from mkb.records import JudgeRecord

SUMMARIES = ("min", "median")
"""How a final grading summarises its processes' medians: the smallest (default), or their median."""
DEFAULT_PROCESSES, DEFAULT_SUMMARY = 5, "min"
"""Fresh processes per final grading, and their summary (docs/judge.md, "Final gradings")."""
TIMING_METHOD = "original window (start, solve, host sync, end); candidate ended before eager; v1"
"""Names the timing procedure in every baseline's fingerprint: a baseline timed another way is re-measured."""


def summarize(values: list[float], how: str) -> float:
    """min(values) or median(values) (how in SUMMARIES)."""
    if how not in SUMMARIES:
        raise ValueError(f"unknown summary {how!r}: use one of {', '.join(SUMMARIES)}")
    return min(values) if how == "min" else statistics.median(values)


def spread(values: list[float]) -> float:
    """max / min - 1: how far apart the figures of identical gradings came out (0 for one value)."""
    return max(values) / min(values) - 1 if values else 0.0


@dataclass(frozen=True)
class Baseline:
    """The eager reference's figure that gradings compare a kernel with, and where it came from."""

    eager_ms: float
    """Summary over processes of each process's median (the original grader's window)."""
    fingerprint: str
    """sha256 of what the figure depends on: problem, GPU, timing mode, scale, toolchain, driver, method."""
    eager_device_ms: float | None = None
    """Median over processes of the reference's profiled device time per call."""
    processes: int = 1
    """Fresh trusted processes it was measured in."""
    summary: str = DEFAULT_SUMMARY
    """How their medians were summarised."""
    eager_ms_each: tuple[float, ...] = field(default_factory=tuple)
    """Each process's median."""
    source: str = "stored"
    """stored (read from the results database) or measured (by the grading that carries it)."""

    def describe(self) -> dict[str, Any]:
        """The baseline as the record's details.eager shows it."""
        return asdict(self) | {"eager_ms_each": list(self.eager_ms_each)}


def _timing(record: JudgeRecord) -> dict:
    return record.details.get("timing") or {}


def per_process(record: JudgeRecord) -> dict[str, Any]:
    """One process's figures: its primary median, the figure that stops at solve()'s return, the trusted
    bracket, device time, its own eager median (when it timed one), where it ran and what it cost."""
    timing = _timing(record)
    kernel, eager = timing.get("kernel") or {}, timing.get("eager") or {}
    return {"status": str(record.status), "kernel_ms": record.kernel_ms,
            "return_ms": kernel.get("self_reported_ms"), "trusted_ms": kernel.get("ms"),
            "device_ms": record.details.get("device_ms"), "eager_ms": eager.get("sync_ms"),
            "eager_return_ms": eager.get("self_reported_ms"), "eager_device_ms": record.details.get("eager_device_ms"),
            "wall_s": round(record.wall_s, 3), "spare": (record.details.get("spare") or {}).get("used"),
            "timed_cpu": (timing.get("cpus") or {}).get("timed")}


def _median(values: list[float | None]) -> float | None:
    found = [v for v in values if v is not None]
    return statistics.median(found) if found else None


def combine(records: list[JudgeRecord], summary: str, baseline: Baseline | None, fingerprint: str) -> JudgeRecord:
    """The final grading's record from its processes' records (in the order they ran).

    The first process that did not pass decides the result (its record, with every process listed). Else
    kernel_ms = summary of the processes' kernel medians; eager_ms = the stored baseline's, or the summary
    of the processes' own eager medians (then details.eager is the measured Baseline, fingerprint given);
    device times are medians over processes (the profiler's clock does not depend on the host).
    """
    each = [per_process(r) for r in records]
    grading = {"mode": "final", "processes": len(records), "summary": summary, "per_process": each}
    wall_s = sum(r.wall_s for r in records)
    failed = next((i for i, r in enumerate(records) if not r.passed), None)
    if failed is not None or records[0].device != "cuda":
        chosen = records[failed or 0]
        grading |= {"decided_by_process": (failed or 0) + 1}
        return chosen.model_copy(update={"details": {**chosen.details, "grading": grading}, "wall_s": wall_s})
    kernel_ms = summarize([e["kernel_ms"] for e in each], summary)
    if baseline is None:
        measured = [e["eager_ms"] for e in each]
        baseline = Baseline(eager_ms=summarize(measured, summary), fingerprint=fingerprint,
                            eager_device_ms=_median([e["eager_device_ms"] for e in each]), processes=len(each),
                            summary=summary, eager_ms_each=tuple(measured), source="measured")
    grading |= {"kernel_ms_each": [e["kernel_ms"] for e in each], "spread": spread([e["kernel_ms"] for e in each])}
    details = {**records[0].details, "grading": grading, "eager": baseline.describe(),
               "device_ms": _median([e["device_ms"] for e in each]), "eager_device_ms": baseline.eager_device_ms}
    return records[0].model_copy(update={"kernel_ms": kernel_ms, "eager_ms": baseline.eager_ms,
                                         "speedup": baseline.eager_ms / kernel_ms, "details": details,
                                         "wall_s": wall_s})


def measured_baseline(record: JudgeRecord) -> Baseline | None:
    """The baseline a passed final grading measured itself (None when it used a stored one, or failed)."""
    eager = record.details.get("eager") or {}
    if not record.passed or eager.get("source") != "measured":
        return None
    return Baseline(**{**eager, "eager_ms_each": tuple(eager.get("eager_ms_each") or ())})


def rebase(record: JudgeRecord, baseline: Baseline) -> JudgeRecord:
    """record compared with another baseline (the stored one, when a concurrent grading stored its own first);
    the baseline it measured stays in details.eager_measured."""
    if not record.passed or record.kernel_ms is None:
        return record
    details = {**record.details, "eager": baseline.describe(), "eager_measured": record.details.get("eager"),
               "eager_device_ms": baseline.eager_device_ms}
    return record.model_copy(update={"eager_ms": baseline.eager_ms, "speedup": baseline.eager_ms / record.kernel_ms,
                                     "details": details})
