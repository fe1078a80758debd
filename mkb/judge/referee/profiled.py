"""The profiled calls of solve(), judged like draws: one profile command per call, its answer compared.

The DSL's share (share.py) and the trace checks (policy.py) are read from profiled calls, and solve() can tell
such a call from any other: torch's profiler flag is on, and the calls come in a fixed place (after the
correctness draws, or after the 60 timed calls). Until 2026-12-07 nothing judged what a profiled call returned,
so a kernel whose DSL part computes nothing (an exact gate on a DSL copy: knockout_exact_gate) ran only that
copy while profiled and returned an empty tensor: its DSL share read 1.0 and it passed the strict policy
(tests/kernels/share_profiled_skip.py). Now every profiled call runs on inputs the referee drew, copies its
answer into the referee's slots, and is judged against the reference of exactly those inputs; so the work the
share weighs is work that computed a correct answer. Each call is a profile command of its own (its answer is
read before the next call), and merge() puts their profiles together as one.
"""

from __future__ import annotations

from typing import Any

from mkb import inplace
from mkb.judge.referee import checks
from mkb.judge.referee.transport import Shared, tree_map
from mkb.judge.referee.verdict import Failure
from mkb.records import Status


def answer(referee, reply: dict, like: Any, slots: Shared, inputs: Any, label: str, place: str) -> tuple:
    """A profiled call's answer (returned, in-place outputs) as private copies on `place`; Failure when the call
    returned another structure. inputs: the shared inputs as the call left them (the referee's views or files)."""
    problem = checks.structure_problem(reply.get("outputs", {}), checks.describe(like, referee.device))
    if problem is not None:
        raise Failure(Status.WRONG_STRUCTURE, f"{label}: {problem}")
    if not reply.get("copied"):
        raise Failure(Status.WRONG_STRUCTURE, f"{label}: the outputs could not be read back as plain tensors")
    now = inputs if slots.tensors is not None else referee.transport.read(inputs)
    updated = tuple(t.detach().to(place, copy=True) for t in inplace.updated(now, referee.positions))
    return referee.transport.read(slots, place), updated


def judge(referee, label: str, seed: int, out: tuple, ref: Any, anchor: Any) -> None:
    """A profiled call's answer against the reference of its inputs (on the reference's device); Failure when wrong."""
    out = tree_map(out, lambda t: t.to(referee.place))
    draw = checks.compare_draw(seed, out, ref, anchor, referee.factor, referee.positions)
    if not draw.ok:
        raise Failure(Status.INCORRECT, f"{label}: " + checks.first_failure(draw, 0).removeprefix("draw 1: ")
                      + " (profiled calls are judged like every other call)")


def merge(replies: list[dict]) -> dict:
    """Profiles of one call each as one profile of them all: the first that failed, if any; else their calls in
    order, kernel instances renumbered by call, kernels summed by name, escaped kernels together."""
    for reply in replies:
        if not reply.get("ok"):
            return reply
    merged: dict = {"ok": True, "calls": [], "instances": [], "kernels": [], "escaped": []}
    by_name: dict[str, dict] = {}
    for reply in replies:
        offset = len(merged["calls"])
        merged["calls"] += [c for c in reply.get("calls") or [] if isinstance(c, dict)]
        merged["instances"] += [{**i, "call": int(i.get("call") or 0) + offset} for i in reply.get("instances") or []
                                if isinstance(i, dict)]
        for kernel in reply.get("kernels") or []:
            if not isinstance(kernel, dict) or not isinstance(kernel.get("name"), str):
                continue
            entry = by_name.setdefault(kernel["name"], {"name": kernel["name"], "count": 0, "device_us": 0.0,
                                                        "streams": []})
            entry["count"] += int(kernel.get("count") or 0)
            entry["device_us"] += float(kernel.get("device_us") or 0.0)
            entry["streams"] += [s for s in kernel.get("streams") or [] if s not in entry["streams"]]
        merged["escaped"] = sorted(set(merged["escaped"]) | {e for e in reply.get("escaped") or []
                                                              if isinstance(e, str)})
        if reply.get("cpu"):
            merged["cpu"] = True
    merged["kernels"] = list(by_name.values())
    if not any(r.get("cpu") for r in replies):
        merged.pop("cpu", None)
    return merged
