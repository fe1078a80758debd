"""The speed measurement of one GPU grading: kernel and eager timed alike, re-checked, profiled.

Runs in the referee after the correctness draws and the policy checks passed. Each call is timed
the original grader's way inside its own process (record start, call solve(), synchronise the host,
record end: `sync_ms`, the primary figure) and by the referee's cross-process bracket (timing.py),
which the candidate cannot influence; the reported kernel_ms is the in-process median only when the
trusted bracket corroborates it (within BAND). The figure that stops when solve() returns
(`self_reported_ms`, the judge's primary figure before issue #27) and the profiler's device time
are kept beside it in details.

The eager reference runs in its own trusted harness process (the same child.py, loaded with the
problem's reference instead of a kernel), timed the same way on the same input pool, and only once
the candidate's processes have ended (Referee.stop_candidate, confirmed by the judge's parent): no
thread or GPU stream the candidate left behind can slow the baseline it is compared with. With
the spec's eager "stored", the baseline comes from the results database (measured once per problem,
GPU and environment) and only the empty calls that calibrate the bracket run here.
"""

from __future__ import annotations

import contextlib
import secrets
from typing import Any

import torch

from mkb.judge.candidate import wire
from mkb.judge.referee import checks, cpus, draws, memory, policy, profiled, share, timing
from mkb.judge.referee.verdict import Failure, JudgeFault
from mkb.records import Status

NULL_CALLS = 30
NULL_PLAIN_CALLS = 10
"""The calibrating empty calls refill their set and launch one tiny kernel, as a timed call does; two smaller
sets of empty calls without the kernel (details.timing.null.no_kernel) and also without the refill
(null.unrefilled, the only kind before 2026-12-03's third session) show what each adds (docs/judge.md)."""
BAND_FRACTION, BAND_FLOOR_MS = 0.25, 0.3
"""The candidate's in-process figure is accepted when it is at least the trusted figure minus
max(this fraction of it, the floor). Measured on the H200 (2026-12-02, 25 gradings of honest
kernels of 0.07-22 ms, window ending at solve()'s return): the trusted figure ran 0.02-0.19 ms above
the in-process one, the most for kernels under 0.15 ms, where switching between the processes' CUDA
contexts dominates; a 0.1 ms floor failed three honest solutions (gaps 0.14, 0.15, 0.19 ms)."""
DEVICE_FRACTION, DEVICE_FLOOR_MS = 0.6, 0.02
"""The in-process figure must also cover the time the launched kernels kept the GPU busy (profiler;
concurrent kernels counted once): at least this fraction of it minus the floor. Honest kernels on
the H200 reported 0.82-1.31x their device time (profiled calls run a little slower); work hidden
from the timed stream shows up here even when it is shorter than the band above."""
METHOD = ("median of 50 calls, each timed in its own process the original grader's way (start event, solve(), "
          "host synchronised, end event), the candidate's corroborated by the referee's cross-process bracket")


def _eager(referee, load: bool) -> wire.Channel:
    """The eager harness, its problem loaded when its calls are timed here (it said hello and passed its
    preflight before kernel.py was imported)."""
    channel = referee.e
    if not load:
        return channel
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

    referee is the running referee.Referee (its channels, transport, draws and details). eager_ms and
    speedup are None when the spec's eager is "stored" (the judge's parent applies the stored baseline).

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
    mode, timed_eager = referee.spec["timing"], referee.spec.get("eager", "time") == "time"
    # the pool (its size fixed with the judge's memory need) and, left in the referee's cache, the memory of one
    # refill: claimed before the kernel's first timed call, and kept (no cache release while the kernel is timed)
    pool = timing.Pool(make=referee.inputs, lend=referee.transport.share, size=referee.pool_sets)
    flush = timing.flush_buffer() if mode == "flushed" else None
    clocks_before = timing.clocks()
    referee.phase = "timing: kernel"
    floor = referee.stream.work_floor()  # what every draw gave the DSL: every timed call must do as much
    kernel_runs, snapshots, picks, c_slots = _time_kernel(referee, pool, flush, timed_cpu, floor)
    referee.phase = "timing: profile"
    profile = _profile(referee, pool, c_slots, snapshots)
    evidence.profile = profile if profile.get("ok") else None
    evidence.report = referee.report()
    evidence.share = share.measure(profile, referee.stream.built, str(referee.dsl))
    referee.phase = "timing: stop candidate"
    referee.details["candidate_stop"] = referee.stop_candidate()
    referee.phase = "timing: re-check"  # after the candidate ended: the fp64 anchors need the GPU it held
    memory.release(referee.device)  # the refill's cache: a re-check is a draw, within the judge's claim
    _recheck(referee, snapshots)
    memory.release(referee.device)  # the eager reference's intermediates come next, in its own process
    referee.phase = "timing: eager"
    null, eager_runs, eager_profile = _time_eager(referee, pool, flush, timed_cpu, timed_eager)
    clocks_after = timing.clocks()
    kernel = timing.summarize(kernel_runs, null)
    eager_fig = timing.summarize(eager_runs, null) if eager_runs else None
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    device_ms = _per_call_ms(profile, "device_us")
    eager_device_ms = _per_call_ms(eager_profile, "device_us") if eager_profile else None
    referee.details.update(
        timing={"mode": mode, "method": METHOD, "kernel": kernel, "eager": eager_fig, "null": null,
                "in_process_null": timing.in_process_null_ms(), "pool_sets": pool.size,
                "device_ms": device_ms, "eager_device_ms": eager_device_ms,
                "eager_source": "timed in this grading" if timed_eager else "stored",
                "rechecked_calls": [i + 1 for i in picks], "dsl_work": _work(floor, kernel_runs),
                "profile_error": None if profile.get("ok") else profile.get("error")},
        clocks={"before": clocks_before, "after": clocks_after}, device_ms=device_ms, eager_device_ms=eager_device_ms,
        gpu={"name": props.name, "cc": f"{props.major}.{props.minor}", "torch_cuda": torch.version.cuda,
             "l2_bytes": getattr(props, "L2_cache_size", None)},
        solve_calls=timing.WARMUP + timing.TIMED + 2 + len(referee.draws) + timing.PROFILED)
    _cross_check(kernel, profile)  # after the figures are in details: a refused grading shows what it was refused on
    kernel_ms = kernel["sync_ms"]
    eager_ms = eager_fig["sync_ms"] if eager_fig else None
    return {"kernel_ms": kernel_ms, "eager_ms": eager_ms, "speedup": eager_ms / kernel_ms if eager_ms else None}


def _work(floor: dict, runs: list[dict]) -> dict:
    """The DSL work rule's figures (timing.work_shortfall): bytes of tensors per DSL callable and argument position, the
    least a draw passed there (floor) and the least a timed call did, each call's work read as the rule reads it (with
    the "<dsl>:*" totals: timing.with_all_callables)."""
    done = [timing.with_all_callables(r["dsl_work"], floor) for r in runs]
    timed = {key: {p: min((timing.work_size(d, key, p) for d in done), default=None) for p in positions}
             for key, positions in floor.items()}
    return {"draws_least": floor, "timed_least": timed, "fraction": timing.WORK_FRACTION}


def _time_kernel(referee, pool: timing.Pool, flush, timed_cpu: int | None,
                 floor: dict) -> tuple[list, dict, list, Any]:
    """The candidate's warm-up and timed calls, with three random timed calls' outputs kept for re-checking (label ->
    (seed, answer)), each held to the draws' DSL work (floor: evidence.Stream.work_floor); the slots the timed calls
    copy into."""
    c_slots = referee.transport.slots(referee.like)
    picks = sorted(secrets.SystemRandom().sample(range(timing.TIMED), timing.RECHECKS))
    snapshots = {}

    def keep(i: int, s: int) -> None:
        if i in picks:
            snapshots[f"timed call {i + 1}"] = (pool.seeds[s], (referee.transport.read(c_slots, referee.place),
                                                                draws.updated(referee, pool.sets[s])))

    c_bracket = timing.Bracket(referee.c, pool, c_slots.tree, cpu=timed_cpu)
    runs = timing.run_calls(c_bracket, pool, flush=flush, on_done=keep, dsl=str(referee.dsl), work=floor)
    referee.c.spin = False
    return runs, snapshots, picks, c_slots


def _profile(referee, pool: timing.Pool, c_slots, snapshots: dict) -> dict:
    """The candidate's profiled calls, one command each on pool set 0 refilled, each answer kept on the host to be
    re-checked with the timed calls' (profiled.py: solve() can tell a profiled call); their merged profile."""
    replies = []
    for k in range(timing.PROFILED):
        pool.refresh(0)
        torch.cuda.synchronize()  # the refill is in the shared memory before the harness reads it
        reply = referee.ask({"cmd": "profile", "set": 0, "calls": 1, "slots": "timing",
                             "restore": [i for i, _ in referee.positions]})
        replies.append(reply)
        if reply.get("ok"):
            label = f"profiled call {k + 1}"
            out = profiled.answer(referee, reply, referee.like, c_slots, pool.sets[0], label, "cpu")
            snapshots[label] = (pool.seeds[0], out)
    return profiled.merge(replies)


def _time_eager(referee, pool: timing.Pool, flush, timed_cpu: int | None, timed: bool) -> tuple[dict, list, dict]:
    """The empty calls that calibrate the bracket and, unless the baseline is stored, the eager reference's
    calls and profile; all in the trusted eager process, after the candidate's processes have ended."""
    eager = _eager(referee, load=timed)
    try:
        e_slots = referee.transport.slots(referee.like)
        e_bracket = timing.Bracket(eager, pool, e_slots.tree, cpu=timed_cpu)
        null = timing.null_figures(timing.run_calls(e_bracket, pool, null="kernel", warmup=5, timed=NULL_CALLS))
        null["no_kernel"] = timing.null_figures(timing.run_calls(e_bracket, pool, null=True, warmup=2,
                                                                 timed=NULL_PLAIN_CALLS))
        null["unrefilled"] = timing.null_figures(timing.run_calls(e_bracket, pool, null=True, warmup=2,
                                                                  timed=NULL_PLAIN_CALLS, refill=False))
        runs = timing.run_calls(e_bracket, pool, flush=flush) if timed else []
        eager.spin = False
        profile = {}
        if timed:
            eager.send({"cmd": "profile", "set": 0, "calls": timing.PROFILED,
                        "restore": [i for i, _ in referee.positions]})
            profile = eager.recv()
        eager.send({"cmd": "finish"})
    except (wire.WireError, timing.TimingError) as exc:
        if "OutOfMemoryError" in str(exc) and referee.budget is not None:  # the trusted eager process's own text
            status, message, _ = memory.outcome(referee.budget, exc, not referee.candidate_ended, "the eager reference")
            raise (Failure(status, message) if status == Status.CRASHED else JudgeFault(message)) from None
        raise Failure(Status.INFRA_ERROR, f"timing the eager reference failed: {exc}") from None
    return null, runs, profile


def _recheck(referee, snapshots: dict) -> None:
    """Three random timed calls' outputs, and every profiled call's, against the reference of exactly their inputs
    (redrawn from their seeds)."""
    for label, (seed, out) in sorted(snapshots.items(), key=lambda item: (item[0].startswith("profiled"), item[0])):
        ref, anchor = referee.reference(referee.inputs(seed))
        memory.release(referee.device)
        if label.startswith("profiled"):
            profiled.judge(referee, label, seed, out, ref, anchor)
            continue
        draw = checks.compare_draw(seed, out, ref, anchor, referee.factor, referee.positions)
        if not draw.ok:
            raise Failure(Status.INCORRECT, f"{label} (re-checked): " + checks.first_failure(draw, 0)
                          .removeprefix("draw 1: "))


def _per_call_ms(profile: dict, key: str) -> float | None:
    """The mean over profiled calls of one per-call figure in microseconds (device_us, busy_us), in ms."""
    calls = profile.get("calls") if profile.get("ok") else None
    if not calls or any(key not in c for c in calls):
        return None
    return sum(c[key] for c in calls) / len(calls) / 1e3


def _cross_check(kernel: dict, profile: dict) -> None:
    """Raise POLICY_VIOLATION when timing_violation() finds the timed window does not hold the work."""
    message = timing_violation(kernel, profile)
    if message:
        raise Failure(Status.POLICY_VIOLATION, message)


def timing_violation(kernel: dict, profile: dict) -> str | None:
    """Why the candidate's timed window does not contain its work, or None.

    kernel is a timing.summarize() figure; profile is the candidate's profiler reply. Three checks: the
    in-process figure (sync_ms) against the trusted bracket, against the launched kernels' busy time,
    and the kernels' span against the bracket. Work left running after solve() returned needs no check
    of its own: the host synchronisation inside the window waits for it (the profiler's marker still
    reports unjoined side streams, policy.py).
    """
    self_ms = kernel.get("sync_ms")
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
