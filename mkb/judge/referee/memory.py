"""The judge's GPU memory: what it measured before kernel.py loaded, what it claims, and who ran out.

The referee, the candidate and the eager process share one GPU. The judge's own need is set by the
problem alone (an input set, the reference, the fp64 anchor of float64 copies of the inputs, the
timing pool), so the referee measures it on the first draw, which it prepares before kernel.py is
imported (nothing of the kernel holds memory yet), and declares it (`need`). What the device has
beyond that and the processes' CUDA contexts is the kernel's allowance between calls. The phases
hand the GPU over: the referee returns its allocator's cache (the anchor's float64 transients)
before every call of the candidate, and the candidate's harness returns the kernel's cache after
every correctness call, so the two peaks never stack.

When the GPU runs out in a trusted process (`blame`), the referee reads the device: if the kernel's
processes then held more than their allowance, the kernel is charged (`crashed`); if they held less,
or had already ended, the judge needed more than it declared and the grading is `infra_error`,
named with its numbers. Nothing the candidate says enters the decision: the referee reads the
device's free memory and its own allocator, and the allowance was fixed before kernel.py was loaded.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

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
    """The judge's declared need beyond its base (bytes): the larger of a draw's peak plus the shared copy of its
    inputs, and the timing pool plus one refill; the answers the judging holds (slots, read outputs, the first
    draw's reference and anchor kept for the repeat) and a margin; then the headroom.

    draw_peak: the referee's peak while it prepared the first draw (inputs, reference, fp64 anchor).
    """
    measured = max(draw_peak + input_set, (pool_sets + 1) * input_set) + answers + JUDGING_MARGIN_BYTES
    return measured + max(HEADROOM_MIN_BYTES, int(HEADROOM_FRACTION * measured))


@dataclass(frozen=True)
class Budget:
    """The grading's memory plan, fixed before kernel.py is imported."""

    base: Reading
    """After every harness passed its preflight: the three processes' CUDA contexts and anything else on the GPU."""
    need: int
    """The judge's declared need beyond base (memory.need)."""

    @property
    def allowance(self) -> int:
        """What the kernel's processes may hold between calls (bytes): the device less base and the judge's need."""
        return self.base.total - self.base.used - self.need

    def others(self, now: Reading) -> int:
        """Bytes taken since base outside the referee's allocator: the kernel's processes (and any newcomer)."""
        return now.used - self.base.used - (now.reserved - self.base.reserved)

    def describe(self) -> dict:
        return {"total_gib": gib(self.base.total), "base_gib": gib(self.base.used),
                "judge_need_gib": gib(self.need), "kernel_allowance_gib": gib(self.allowance)}


def gib(nbytes: int) -> float:
    return round(nbytes / GIB, 2)


def blame(budget: Budget, now: Reading, candidate_alive: bool, where: str) -> tuple[bool, str]:
    """Whether the kernel is charged for the GPU running out in a trusted process, and the record's message.

    Charged only while its processes live and hold more than their allowance; otherwise the judge needed more
    than it declared (or more than the device has), which the kernel could not cause.
    """
    held, judge = budget.others(now), now.reserved - budget.base.reserved
    numbers = (f"the judge held {gib(judge)} GiB, declared {gib(budget.need)} GiB; the kernel's processes held "
               f"{gib(max(held, 0))} GiB, allowed {gib(budget.allowance)} GiB between calls, of a "
               f"{gib(budget.base.total)} GiB device")
    if candidate_alive and held > budget.allowance:
        return True, (f"the GPU ran out of memory in the judge ({where}) while the kernel's processes held more than "
                      f"their allowance ({numbers}): release GPU memory that solve() no longer needs when it returns")
    if not candidate_alive:
        return False, (f"the judge ran out of GPU memory ({where}) after the kernel's processes had ended ({numbers}): "
                       f"this problem needs more GPU memory for the judge than the device has; not charged")
    return False, (f"the judge ran out of GPU memory ({where}) with the kernel's processes inside their allowance "
                   f"({numbers}): the judge needed more than it declared; not charged")
