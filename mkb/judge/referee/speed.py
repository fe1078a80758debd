"""The speed measurement of one GPU grading: eager and kernel timed alike, re-checked, profiled.

Runs in the referee after the correctness draws and the policy checks passed. The eager
reference runs in its own trusted harness process (the same child.py, loaded with the problem's
reference instead of a kernel), so both are timed the same way, on the same rotating input pool,
in the same judge run. Each call is timed twice: by CUDA events around solve() inside its own
process (the paper's figure) and by the referee's cross-process bracket (timing.py), which the
candidate cannot influence. The reported kernel_ms is the in-process median only when the trusted
bracket corroborates it (within BAND); eager_ms comes from the trusted eager process.
"""

from __future__ import annotations

import contextlib
import secrets

import torch

from mkb import tensortree as tt
from mkb.judge.candidate import wire
from mkb.judge.referee import checks, cpus, policy, share, timing
from mkb.judge.referee.verdict import Failure
from mkb.records import Status

NULL_CALLS = 30
TAIL_ALLOWANCE, TAIL_FLOOR_MS = 0.5, 0.5
"""Work still running after solve() returned may add at most max(this fraction of kernel_ms, the floor).

Measured on the H200: an honest 0.15 ms kernel showed 0.12 ms more tail than an empty call
(context switches between the processes' CUDA contexts), a hidden 5 ms side stream 2.7 ms."""
BAND_FRACTION, BAND_FLOOR_MS = 0.25, 0.3
"""The candidate's in-process figure is accepted when it is at least the trusted figure minus
max(this fraction of it, the floor). Measured on the H200 (2026-12-02, 25 gradings of honest
kernels of 0.07-22 ms): the trusted figure ran 0.02-0.19 ms above the in-process one, the most
for kernels under 0.15 ms, where switching between the processes' CUDA contexts dominates; a
0.1 ms floor failed three honest solutions (gaps 0.14, 0.15, 0.19 ms)."""
DEVICE_FRACTION, DEVICE_FLOOR_MS = 0.6, 0.02
"""The in-process figure must also cover the time the launched kernels kept the GPU busy (profiler;
concurrent kernels counted once): at least this fraction of it minus the floor. Honest kernels on
the H200 reported 0.82-1.31x their device time (profiled calls run a little slower); work hidden
from the timed stream shows up here even when it is shorter than the band above."""


def _eager(referee) -> wire.Channel:
    """The eager harness, its problem loaded (it said hello and passed its preflight before kernel.py was)."""
    channel = referee.e
    try:
        channel.send({"cmd": "load"})
        loaded = channel.recv()
    except wire.WireError as exc:
        raise Failure(Status.INFRA_ERROR, f"the eager reference process died: {exc}") from None
    if not loaded.get("ok"):
        raise Failure(Status.INFRA_ERROR, f"the eager reference process failed to load: {loaded.get('error')}")
    return channel


def measure(referee, evidence: policy.Evidence) -> dict:
    """kernel_ms, eager_ms, speedup and the timing details; raises Failure for a bad candidate.

    referee is the running referee.Referee (its channels, transport, draws and details).

    With the spec's pin_cpus, the referee and the timed harness each run on a physical core of their
    own while timing (cpus.py); details.timing.cpus says where they ran, or why nothing was pinned.
    """
    wanted = bool(referee.spec.get("pin_cpus"))
    with cpus.claimed(2, _pci_bus_id()) if wanted else contextlib.nullcontext() as cores:
        placement = ({"referee": cores[0][0], "timed": cores[1][0], "cores": [list(c) for c in cores]} if cores
                     else {"referee": None, "timed": None,
                           "why": "no free physical cores (or no topology, or no lock directory)" if wanted else "pinning is off (MKB_JUDGE_PIN_CPUS=0)"})
        with cpus.pinned(placement["referee"]):
            result = _measure(referee, evidence, placement["timed"])
    referee.details["timing"]["cpus"] = placement
    return result


def _pci_bus_id() -> str | None:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    bus = getattr(props, "pci_bus_id", None)
    if isinstance(bus, int):
        return f"{getattr(props, 'pci_domain_id', 0):04x}:{bus:02x}:{getattr(props, 'pci_device_id', 0):02x}.0"
    return bus


def _measure(referee, evidence: policy.Evidence, timed_cpu: int | None) -> dict:
    mode = referee.spec["timing"]
    referee.phase = "timing: eager"
    eager = _eager(referee)
    probe = referee.inputs(secrets.randbits(63))
    pool = timing.Pool(make=referee.inputs, share=lambda t, tag: wire.ipc_share(t),
                       size=timing.pool_size(tt.nbytes(probe)))
    like = referee.like  # the draws' output structure: shapes are fixed per problem (CONTRACT.md)
    flush = timing.flush_buffer() if mode == "flushed" else None
    try:
        e_slots, _ = referee.transport.slots(like, "te")
        e_bracket = timing.Bracket(eager, pool, e_slots, cpu=timed_cpu)
        null = timing.null_figures(timing.run_calls(e_bracket, pool, null=True, warmup=5, timed=NULL_CALLS))
        floor = timing.in_process_null_ms()
        clocks_before = timing.clocks()
        eager_runs = timing.run_calls(e_bracket, pool, flush=flush)
        eager.spin = False
        eager.send({"cmd": "finish"})
    except (wire.WireError, timing.TimingError) as exc:
        raise Failure(Status.INFRA_ERROR, f"timing the eager reference failed: {exc}") from None
    referee.phase = "timing: kernel"
    c_slot_tree, c_slots = referee.transport.slots(like, "tc")
    c_bracket = timing.Bracket(referee.c, pool, c_slot_tree, cpu=timed_cpu)
    picks = sorted(secrets.SystemRandom().sample(range(timing.TIMED), timing.RECHECKS))
    snapshots = {}

    def keep(i: int, s: int) -> None:
        if i in picks:
            snapshots[i] = (pool.seeds[s], (referee.transport.read(c_slot_tree, c_slots, referee.place),
                                            referee.updated(pool.sets[s])))

    kernel_runs = timing.run_calls(c_bracket, pool, flush=flush, on_done=keep)
    clocks_after = timing.clocks()
    referee.c.spin = False
    referee.phase = "timing: re-check"
    _recheck(referee, snapshots)
    kernel, eager_fig = timing.summarize(kernel_runs, null, floor), timing.summarize(eager_runs, null, floor)
    referee.phase = "timing: profile"
    profile = referee.ask({"cmd": "profile", "set": 0, "calls": timing.PROFILED,
                           "restore": [i for i, _ in referee.positions]})
    evidence.profile = profile if profile.get("ok") else None
    evidence.report = referee.report()
    evidence.share = share.measure(profile, referee.stream.built, str(referee.dsl))
    device_ms = _per_call_ms(profile, "device_us")
    _cross_check(kernel, null, profile)
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    referee.details.update(
        timing={"mode": mode, "kernel": kernel, "eager": eager_fig, "null": null, "in_process_floor_ms": floor,
                "pool_sets": pool.size, "rechecked_calls": [i + 1 for i in picks],
                "profile_error": None if profile.get("ok") else profile.get("error")},
        clocks={"before": clocks_before, "after": clocks_after}, device_ms=device_ms,
        gpu={"name": props.name, "cc": f"{props.major}.{props.minor}", "torch_cuda": torch.version.cuda,
             "l2_bytes": getattr(props, "L2_cache_size", None)},
        solve_calls=timing.WARMUP + timing.TIMED + 2 + len(referee.draws) + timing.PROFILED)
    kernel_ms, eager_ms = kernel["self_reported_ms"], eager_fig["self_reported_ms"] or eager_fig["ms"]
    referee.details["timing"]["method"] = ("median of events around solve() in each process (the paper's figure), "
                                           "the candidate's corroborated by the referee's cross-process bracket")
    return {"kernel_ms": kernel_ms, "eager_ms": eager_ms, "speedup": eager_ms / kernel_ms}


def _recheck(referee, snapshots: dict) -> None:
    """Three random timed calls' outputs against the reference of exactly their inputs."""
    for i, (seed, out) in sorted(snapshots.items()):
        ref, anchor = referee.reference(referee.inputs(seed))
        draw = checks.compare_draw(seed, out, ref, anchor, referee.factor, referee.positions)
        if not draw.ok:
            raise Failure(Status.INCORRECT, f"timed call {i + 1} (re-checked): " + checks.first_failure(draw, 0)
                          .removeprefix("draw 1: "))


def _per_call_ms(profile: dict, key: str) -> float | None:
    """The mean over profiled calls of one per-call figure in microseconds (device_us, busy_us), in ms."""
    calls = profile.get("calls") if profile.get("ok") else None
    if not calls or any(key not in c for c in calls):
        return None
    return sum(c[key] for c in calls) / len(calls) / 1e3


def _cross_check(kernel: dict, null: dict, profile: dict) -> None:
    """Raise POLICY_VIOLATION when timing_violation() finds the timed window does not hold the work."""
    message = timing_violation(kernel, null, profile)
    if message:
        raise Failure(Status.POLICY_VIOLATION, message)


def timing_violation(kernel: dict, null: dict, profile: dict) -> str | None:
    """Why the candidate's timed window does not contain its work, or None.

    kernel and null are timing.summarize()/null_figures() figures; profile is the candidate's profiler
    reply. Four checks: the tail after solve() returned, the in-process figure against the trusted
    bracket, the in-process figure against the launched kernels' device time, the kernels' span.
    """
    tail_excess = kernel["tail_ms"] - null["tail_ms"]
    if tail_excess > max(TAIL_ALLOWANCE * kernel["ms"], TAIL_FLOOR_MS):
        return (f"GPU work kept running {tail_excess:.3f} ms after solve() returned (timed {kernel['ms']:.3f} ms): "
                f"launch on the current stream or join side streams before returning")
    self_ms = kernel.get("self_reported_ms")
    if self_ms is None or self_ms < kernel["ms"] - max(BAND_FRACTION * kernel["ms"], BAND_FLOOR_MS):
        return (f"the in-process timer reported {self_ms} ms against {kernel['ms']:.4f} ms on the trusted clock: "
                f"timers were tampered with, or work escaped the timed stream")
    busy_ms = _per_call_ms(profile, "busy_us")  # concurrent kernels counted once
    if busy_ms is not None and self_ms < DEVICE_FRACTION * busy_ms - DEVICE_FLOOR_MS:
        return (f"the in-process timer reported {self_ms:.4f} ms but the launched kernels kept the GPU busy "
                f"{busy_ms:.4f} ms per call: work escaped the timed stream")
    spans = [c["span_us"] / 1e3 for c in (profile.get("calls") or [])] if profile.get("ok") else []
    if spans and min(spans) > 2 * kernel["ms"] + 0.05:
        return (f"the launched kernels span {min(spans):.3f} ms per call but the timed window was "
                f"{kernel['ms']:.3f} ms: work escapes the timed stream")
    return None
