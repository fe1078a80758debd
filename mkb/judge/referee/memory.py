"""The judge's GPU memory: what it measured before kernel.py loaded, what it claims, and who ran out.

The referee, the candidate and the eager process share one GPU. The judge's own need is set by the
problem alone (an input set, the reference, the fp64 anchor of float64 copies of the inputs, the
timing pool), so the referee measures it on the first draw, which it prepares before kernel.py is
imported (nothing of the kernel holds memory yet), and claims it (`plan`). What the device has
beyond the claim and the floor (the processes' CUDA contexts and the libraries they loaded) is
the kernel's allowance between calls. The phases hand the GPU over: the referee returns its
allocator's cache (the anchor's float64 transients) before every call of the candidate, and the
candidate's harness returns the kernel's cache after every correctness call, so the two peaks
never stack. While the kernel is timed the referee keeps what it claimed for the timing pool.

When the GPU runs out in a trusted process (`blame`), the referee reads the device: if the kernel's
processes then held more than their allowance, the kernel is charged (`crashed`); if they held less,
or had already ended, the judge needed more than it claimed and the grading is `infra_error`,
named with its numbers. Nothing the candidate says enters the decision: the referee reads the
device's free memory and its own allocator, and the allowance was fixed before kernel.py was loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mkb import tensortree as tt
from mkb.judge.referee.timing import pool_size
from mkb.records import Status

GIB = 1 << 30
HEADROOM_FRACTION, HEADROOM_MIN_BYTES = 0.1, 2 * GIB
"""Added to the judge's measured need: later draws differ from the first in data-dependent sizes
(routing, per-expert token counts, redraw loops), and the allocator rounds and fragments."""
JUDGING_MARGIN_BYTES = 1 * GIB
"""Besides the answers: the comparison's float64 chunks and masks (tensortree.compare)."""


@dataclass(frozen=True)
class Reading:
    """The device as the referee sees it at one moment (bytes)."""

    total: int
    """The device's capacity."""
    used: int
    """In use by every process on the device (capacity minus cudaMemGetInfo's free)."""
    reserved: int
    """Held by the referee's own allocator (torch.cuda.memory_reserved, shared pool included)."""


def read() -> Reading:
    free, total = torch.cuda.mem_get_info()
    return Reading(total=total, used=total - free, reserved=torch.cuda.memory_reserved())


def release(device: str) -> None:
    """Hand the GPU over: give the referee's cached, unused blocks back to the device."""
    if device == "cuda":
        torch.cuda.empty_cache()


def need(draw_peak: int, input_set: int, answers: int, pool_sets: int) -> int:
    """The judge's need beyond what its allocator held before the first draw (bytes): a draw's peak beside the shared
    input sets (the arena's one while the draws are graded, the timing pool's while timed calls are re-checked; the
    pool and one refill while the kernel is timed are less, a draw holding at least its inputs), the answers the
    judging holds on the GPU and a margin; then the headroom.

    draw_peak: the referee's peak while it prepared the first draw (inputs, reference, fp64 anchor).
    """
    measured = draw_peak + pool_sets * input_set + answers + JUDGING_MARGIN_BYTES
    return measured + max(HEADROOM_MIN_BYTES, int(HEADROOM_FRACTION * measured))


def answers_on_gpu(answer: int, anchor_answer: int, place: str) -> int:
    """What the judging keeps on the GPU besides the draws: the output slots (an answer), and when draws are judged
    there (place cuda) the copy of the outputs, the first draw's reference and anchor kept for the repeat, and the
    three timed calls' outputs kept for their re-check."""
    return answer + (3 * answer + anchor_answer if place == "cuda" else 0)


@dataclass(frozen=True)
class Budget:
    """The grading's memory plan, fixed before kernel.py is imported."""

    total: int
    """The device's capacity."""
    floor: int
    """In use on the device besides the referee's allocator once the first draw was made: the three processes'
    CUDA contexts, the libraries they loaded, anything else on the GPU."""
    claim: int
    """What the referee's allocator may hold: its reservation before the first draw plus the judge's need."""

    @property
    def allowance(self) -> int:
        """What the kernel's processes may hold between calls (bytes): the device less the floor and the claim."""
        return self.total - self.floor - self.claim

    def others(self, now: Reading) -> int:
        """Bytes in use now beyond the floor and the referee's allocator: the kernel's processes (and any newcomer)."""
        return now.used - self.floor - now.reserved

    def describe(self) -> dict:
        return {"total_bytes": self.total, "floor_bytes": self.floor, "judge_claim_bytes": self.claim,
                "kernel_allowance_bytes": self.allowance}


def plan(before: Reading, after: Reading, peak: int, input_set: int, answers: int, pool_sets: int) -> Budget:
    """The budget from readings taken before and after the first draw was prepared (kernel.py not yet imported)
    and the referee allocator's peak in between (torch.cuda.max_memory_reserved)."""
    claim = before.reserved + need(peak - before.reserved, input_set, answers, pool_sets)
    return Budget(total=after.total, floor=after.used - after.reserved, claim=claim)


def gib(nbytes: int) -> float:
    return round(nbytes / GIB, 2)


def blame(budget: Budget, now: Reading, candidate_alive: bool, where: str) -> tuple[bool, str]:
    """Whether the kernel is charged for the GPU running out in a trusted process, and the record's message.

    Charged only while its processes live and hold more than their allowance; otherwise the judge needed more
    than it declared (or more than the device has), which the kernel could not cause.
    """
    held = budget.others(now)
    numbers = (f"the judge held {gib(now.reserved)} GiB, claimed {gib(budget.claim)} GiB; the kernel's processes "
               f"held {gib(max(held, 0))} GiB, allowed {gib(budget.allowance)} GiB between calls, of a "
               f"{gib(budget.total)} GiB device")
    if candidate_alive and held > budget.allowance:
        return True, (f"the GPU ran out of memory in the judge ({where}) while the kernel's processes held more than "
                      f"their allowance ({numbers}): release GPU memory that solve() no longer needs when it returns")
    if not candidate_alive:
        return False, (f"the judge ran out of GPU memory ({where}) after the kernel's processes had ended ({numbers}): "
                       f"this problem needs more GPU memory for the judge than the device has; not charged")
    return False, (f"the judge ran out of GPU memory ({where}) with the kernel's processes inside their allowance "
                   f"({numbers}): the judge needed more than it declared; not charged")


def declare(inputs: list, ref: Any, anchor: Any, place: str, before: Reading | None) -> tuple[Budget | None, int, dict]:
    """The budget (None on CPU), the timing pool's sets and details.memory, from the first draw, made before
    kernel.py is imported; `before` is the reading taken before it was made (torch's peak statistics reset then)."""
    input_set = sum({(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()): t.untyped_storage().nbytes()
                     for _, t in tt.flatten(inputs, "in") if isinstance(t, torch.Tensor)}.values())
    details = {"input_set_bytes": input_set, "answer_bytes": tt.nbytes(ref), "anchor_answer_bytes": tt.nbytes(anchor),
               "judged_on": place}
    if before is None:
        return None, 1, details
    after, peak = read(), torch.cuda.max_memory_reserved()
    sets = pool_size(input_set, after.total - after.used)
    budget = plan(before, after, peak, input_set, answers_on_gpu(tt.nbytes(ref), tt.nbytes(anchor), place), sets)
    return budget, sets, {**details, "first_draw_peak_bytes": peak - before.reserved, "pool_sets": sets,
                          **budget.describe(), "used_at_phase_start_bytes": {}}


def outcome(budget: Budget | None, exc: BaseException, candidate_alive: bool, where: str) -> tuple[Status, str, dict]:
    """Status, message and details.memory entries for the referee's own allocation failing (blame)."""
    if budget is None and where == "first draw":  # nothing of the kernel ran yet: the judge alone did not fit
        return Status.INFRA_ERROR, (f"the judge ran out of GPU memory preparing the first draw, before kernel.py was "
                                    f"imported (the problem's inputs, reference and fp64 anchor do not fit on this "
                                    f"device): {str(exc)[:300]}"), {}
    if budget is None:  # no device to read (CPU): the referee cannot tell, and the rule of verdict.charged holds
        return Status.INFRA_ERROR, f"referee failed: {type(exc).__name__}: {str(exc)[:300]}", {}
    now = read()
    kernel, message = blame(budget, now, candidate_alive, where)
    return Status.CRASHED if kernel else Status.INFRA_ERROR, message, {"at_failure": {
        "used_bytes": now.used, "judge_bytes": now.reserved, "kernel_bytes": budget.others(now), "error": str(exc)[:300]}}


def sample(details: dict, phase: str) -> None:
    """Record the device's use as a phase starts (details.memory.used_at_phase_start_bytes: every process together)."""
    if "used_at_phase_start_bytes" in details:
        details["used_at_phase_start_bytes"][phase] = read().used


def finish(budget: Budget | None, details: dict) -> None:
    """The referee allocator's peak over the grading (from the first draw on), beside its claim."""
    if budget is not None:
        details["judge_peak_bytes"] = torch.cuda.max_memory_reserved()


def note(budget: Budget | None, error: str) -> str:
    """For a kernel that ran out of GPU memory in its call: what the judge held then and the kernel's allowance
    (information only: its status stays runtime_error whatever the error text says)."""
    if budget is None or "OutOfMemoryError" not in error:
        return ""
    now = read()
    return (f" (GPU memory: the judge held {gib(now.reserved)} GiB at that point, claimed {gib(budget.claim)} GiB; "
            f"a kernel may keep {gib(budget.allowance)} GiB between calls of this {gib(now.total)} GiB device)")
