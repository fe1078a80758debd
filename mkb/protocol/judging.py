"""The judge as a run uses it: feedback gradings in one set of processes, final gradings in several, both
against the eager baseline stored for the problem, GPU model and environment (issue #27).

A final grading (judge.grade_final) whose baseline is not stored yet measures one in its own fresh
trusted processes; the first one stored is kept (store.baselines.keep_baseline) and every later grading
of that problem on that GPU model and environment, feedback or final, every arm, is compared with it. A
feedback grading never stores one (it is one process). On the CPU nothing is timed and nothing is stored.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mkb.environment import Device
from mkb.judge import grade, grade_final, robust
from mkb.judge.final import baseline_fingerprint
from mkb.records import JudgeRecord, ProblemInfo
from mkb.settings import Settings
from mkb.store import EagerBaseline, Store, now
from mkb.store.baselines import find_baseline, keep_baseline


ANY = "any"
"""The slot of a grading not pinned to a GPU (the judge's processes see what this process sees)."""


def as_baseline(row: EagerBaseline) -> robust.Baseline:
    """A stored baseline as the judge takes it."""
    return robust.Baseline(eager_ms=row.eager_ms, fingerprint=row.fingerprint, eager_device_ms=row.eager_device_ms,
                           processes=row.processes, summary=row.summary, eager_ms_each=tuple(row.eager_ms_each),
                           source="stored")


def as_row(baseline: robust.Baseline, parts: dict, measured_by: str) -> EagerBaseline:
    """A measured baseline as the store keeps it."""
    return EagerBaseline(fingerprint=baseline.fingerprint, problem_id=parts["problem"], gpu=parts["gpu"],
                         timing=parts["timing"], scale=parts["scale"], fingerprint_parts=parts,
                         eager_ms=baseline.eager_ms, eager_device_ms=baseline.eager_device_ms,
                         processes=baseline.processes, summary=baseline.summary,
                         eager_ms_each=list(baseline.eager_ms_each), measured_by=measured_by, created_at=now())


@dataclass
class Judging:
    """grade callables for one device and results database: feedback() and final(), each
    (problem, kernel_path, dsl, device_slot) -> JudgeRecord, as the judge pool calls them."""

    settings: Settings
    device: Device
    store: Store | None
    timing: str = "paper"
    processes: int | None = None
    """Fresh processes per final grading (None: the settings' judge_final_processes)."""
    summary: str | None = None
    """min or median (None: the settings' judge_final_summary)."""
    scale: str | None = None
    """Problem scale (None: the device's: full on a GPU, smoke on the CPU)."""
    timeout_s: float | None = None
    """Limit of each grading (None: the settings' judge_timeout_s)."""
    grade_one: Callable[..., JudgeRecord] = grade
    """The judge's single grading (mkb.judge.grade); tests hand in another."""
    grade_several: Callable[..., JudgeRecord] = grade_final
    """The judge's final grading (mkb.judge.grade_final); tests hand in another."""

    @property
    def _scale(self) -> str:
        return self.scale or self.device.scale

    def gpu(self, slot: str) -> str:
        """The GPU model a slot (a GPU index) names; the device's name on the CPU."""
        by_index = {str(g["index"]): g["name"] for g in self.device.gpus}
        return by_index.get(slot.split(",")[0], self.device.name)

    def _pin(self, slot: str) -> dict:
        return {} if slot in ("cpu", ANY) else {"visible_devices": slot}

    def stored(self, problem: ProblemInfo, slot: str) -> tuple[robust.Baseline | None, str, dict]:
        """The baseline stored for this problem on this slot's GPU model (or None), its fingerprint and parts."""
        fingerprint, parts = baseline_fingerprint(problem, self.gpu(slot), self.timing, self._scale)
        if self.device.kind != "cuda" or self.store is None:
            return None, fingerprint, parts
        row = find_baseline(self.store, fingerprint)
        return (as_baseline(row) if row else None), fingerprint, parts

    def feedback(self, problem: ProblemInfo, kernel_path: str, dsl, device_slot: str = "cpu") -> JudgeRecord:
        """One grading in one set of fresh processes, against the stored baseline when there is one."""
        baseline, _, _ = self.stored(problem, device_slot)
        return self.grade_one(problem, kernel_path, dsl, device=self.device.kind, timing=self.timing,
                              settings=self.settings, scale=self._scale, timeout_s=self.timeout_s, baseline=baseline,
                              **self._pin(device_slot))

    def final(self, problem: ProblemInfo, kernel_path: str, dsl, device_slot: str = "cpu",
              measured_by: str = "") -> JudgeRecord:
        """The attempt's result: grade_final over fresh processes; a baseline it measured is stored (the first
        one stored wins: the record is then compared with that one)."""
        baseline, _, parts = self.stored(problem, device_slot)
        record = self.grade_several(problem, kernel_path, dsl, device=self.device.kind, timing=self.timing,
                                    settings=self.settings, scale=self._scale, timeout_s=self.timeout_s,
                                    gpu=parts["gpu"], processes=self.processes or self.settings.judge_final_processes,
                                    summary=self.summary or self.settings.judge_final_summary, baseline=baseline,
                                    **self._pin(device_slot))
        measured = robust.measured_baseline(record)
        if measured is None or self.store is None or self.device.kind != "cuda":
            return record
        kept = keep_baseline(self.store, as_row(measured, parts, measured_by or f"final grading of {problem.id} {dsl}"))
        return record if kept.eager_ms == measured.eager_ms else robust.rebase(record, as_baseline(kept))


class Grader:
    """What an attempt's toolbox calls: grader(kernel_path) for feedback, grader.final(kernel_path) for the result."""

    def __init__(self, feedback: Callable[[str], object], final: Callable[[str], object]):
        self._feedback, self.final = feedback, final

    def __call__(self, kernel_path: str):
        return self._feedback(kernel_path)


def dispatch(feedback: Callable[..., object], final_grade: Callable[..., object]) -> Callable[..., object]:
    """One grade function for the judge pool: final_grade(...) when called with final=True, else feedback(...)."""

    def run(*args, final: bool = False, **kwargs):
        return (final_grade if final else feedback)(*args, **kwargs)

    return run
