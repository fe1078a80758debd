"""Trusted timing across processes: the referee's own clock brackets each solve() call.

Threat model. The candidate process can replace any Python or torch function it can reach, so
no clock inside it is trusted. The referee (a separate process that never imports the candidate)
owns the trusted clock: per call it synchronises its device (the pool refill and the L2 flush are
done), reads its host clock (T0) and tells the harness to go. The harness records its own start
event, calls solve(), synchronises the host with the device (the original grader's window) and
records its end event, then answers "launched"; the referee reads its clock again (T1). The
harness's whole window lies inside [T0, T1], which a monkeypatched timer in the candidate cannot
touch, and the referee does nothing on the GPU meanwhile. Both sides busy-poll their pipes while
timing, so a message costs microseconds, not a scheduler wake-up.

Why the host clock. Until 2026-12-03 the bracket was two GPU events on the referee's stream
around a cross-process wait (CUDA IPC events, then wire.Signal stream-memory waits once the
sandbox refused IPC events). On the H200 the signal bracket ran 0.35-0.45 ms above the harness's
window even after an empty call's bracket was taken away, so every honest kernel under ~0.3 ms
was refused as "timers tampered with" (artifact/judge/h200_solutions_2026-12-03-s2-bracket.json):
waits between two processes' CUDA contexts are scheduled by the GPU's time slicing, which an empty
call does not reproduce. The host clock bounds the same window with none of that: it can only
be longer than the window, by the pipe messages and the host's scheduling.

The bracket adds those messages to every call. The same bracket around a call that does
nothing, measured in the trusted eager process, calibrates that away; what remains is adjusted to
the in-process window of an empty call. speed.py uses the result to corroborate the in-process
figure that the record reports.
"""

from __future__ import annotations

import os
import secrets
import shutil
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from mkb.judge.candidate import wire
from mkb.judge.referee import evidence

WARMUP, TIMED, RECHECKS, PROFILED = 10, 50, 3, 3
WORK_FRACTION = 0.5
"""A timed call must pass each DSL callable that every draw called at least this fraction of the bytes of tensors the
draws passed it at each argument position (the least over the draws; run_calls). Honest kernels pass the same tensors
every call; a fraction below 1 leaves room for work that depends on the data (a mixture of experts' routing)."""
POOL_SETS, POOL_BUDGET_BYTES = 4, 8 << 30
"""Input sets shared with the harnesses (fewer when they would pass the byte budget). Every call but a
set's very first (a warm-up call of the candidate, timed first) gets its set refilled with new random content
right before it is sent, so nothing can be precomputed for a timed call, e.g. by a thread working
through the pool, and no call sees inputs that an earlier call updated in place (MUTATES)."""


class TimingError(Exception):
    """The candidate failed during a timed call (the message says how)."""

    def __init__(self, message: str, kind: str = "runtime_error"):
        super().__init__(message)
        self.kind = kind


@dataclass
class Pool:
    """Input sets the timed calls rotate through, owned by the referee and shared with the harnesses.

    make(seed) draws a set in the referee's private memory; lend(inputs) copies one into shared memory
    (transport.Transport.share, which returns the shared views and their tree). A refill draws privately
    and copies in, so nothing the harnesses can map is ever computed on.
    """

    make: Callable[[int], list]
    lend: Callable[[list], Any]
    size: int
    seeds: list[int] = field(default_factory=list)
    sets: list[list] = field(default_factory=list)
    trees: list[dict] = field(default_factory=list)
    used: set[int] = field(default_factory=set)
    """Sets a call has run on since their last refill."""

    def __post_init__(self) -> None:
        for _ in range(self.size):
            self.seeds.append(secrets.randbits(63))
            shared = self.lend(self.make(self.seeds[-1]))
            self.sets.append(shared.tensors)
            self.trees.append(shared.tree)

    def refresh(self, s: int) -> None:
        """New random content for set s, in place (the harnesses keep their mappings)."""
        self.seeds[s] = secrets.randbits(63)
        fresh = self.make(self.seeds[s])
        for old, new in zip(_tensors(self.sets[s]), _tensors(fresh)):
            old.copy_(new)
        self.used.discard(s)


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensors(o)]
    return [obj] if isinstance(obj, torch.Tensor) else []


def pool_size(set_bytes: int, free_bytes: int) -> int:
    """Input sets in the timing pool: POOL_SETS, fewer when they would pass POOL_BUDGET_BYTES or a quarter of
    the device's free memory (measured before kernel.py is imported, so the pool is part of the judge's
    declared need, memory.need), at least one."""
    budget = min(POOL_BUDGET_BYTES, free_bytes // 4)
    return max(1, min(POOL_SETS, budget // max(set_bytes, 1)))


class Bracket:
    """The referee's side of the per-call bracket with one harness process (the referee's host clock)."""

    def __init__(self, channel: wire.Channel, pool: Pool, slots: dict, cpu: int | None = None):
        self.channel, self.pool = channel, pool
        _request(channel, {"cmd": "timing_setup", "pool": pool.trees, "slots": slots, "cpu": cpu})
        channel.spin = True

    def call(self, k: int, set_index: int, null: bool | str = False, flush: torch.Tensor | None = None) -> dict:
        """One bracketed call: ms (T1-T0 on the referee's clock) and the harness's own figures, sync_ms (the
        original grader's window: start, solve(), host synchronised, end) and self_ms (start to solve()'s return)."""
        if flush is not None:
            flush.zero_()
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        self.channel.send({"cmd": "timed", "k": k, "set": set_index, "null": null})
        _expect(self.channel.recv(), "launched")
        t1 = time.perf_counter_ns()
        done = _expect(self.channel.recv(), "done")
        calls, work = done.get("dsl_calls"), done.get("dsl_work")
        return {"ms": (t1 - t0) / 1e6, "sync_ms": done.get("sync_ms"), "self_ms": done.get("self_ms"),
                "copied": bool(done.get("copied")), "dsl_calls": calls if isinstance(calls, dict) else {},
                "dsl_work": work if isinstance(work, dict) else {}}


def settle(event: torch.cuda.Event, limit_s: float, why: str) -> None:
    """Wait for event on the host, at most limit_s (a wait on a signal that never comes would block forever)."""
    deadline = time.monotonic() + limit_s
    while not event.query():
        if time.monotonic() > deadline:
            raise TimingError(f"{why} within {limit_s:g} s", "timeout")
        time.sleep(0)


def _request(channel: wire.Channel, message: dict) -> dict:
    channel.send(message)
    return _expect(channel.recv(), "ok")


def _expect(reply: dict, key: str) -> dict:
    if not reply.get("ok", False):
        raise TimingError(reply.get("error", "the harness failed"), reply.get("kind", "runtime_error"))
    if key != "ok" and key not in reply:
        raise TimingError(f"protocol error: expected '{key}', got {sorted(reply)}", "crashed")
    return reply


def in_process_null_ms(repeats: int = 50) -> dict:
    """An empty call timed in this process, the original grader's way and back to back (medians, ms).

    window_ms: record start, synchronise the host, record end: what metakernelbench's median_ms reads
    for a solve() that does nothing. pair_ms: two events recorded back to back. Set beside the harness's
    own empty window (null.sync_ms) they show what the bracket's messages add inside the window.
    """
    window, pair = [], []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(repeats):
        torch.cuda.synchronize()
        start.record()
        torch.cuda.synchronize()
        end.record()
        end.synchronize()
        window.append(start.elapsed_time(end))
        start.record()
        end.record()
        end.synchronize()
        pair.append(start.elapsed_time(end))
    return {"window_ms": statistics.median(window), "pair_ms": statistics.median(pair)}


def flush_buffer() -> torch.Tensor:
    """A buffer of at least twice the L2 size; zeroing it evicts L2 before a flushed call."""
    l2 = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 0) or (64 << 20)
    return torch.empty(max(2 * l2, 128 << 20), dtype=torch.uint8, device="cuda")


def run_calls(bracket: Bracket, pool: Pool, *, null: bool | str = False, flush: torch.Tensor | None = None,
              warmup: int = WARMUP, timed: int = TIMED, on_done: Callable[[int, int], None] | None = None,
              refill: bool = True, dsl: str | None = None, work: dict | None = None) -> list[dict]:
    """warmup + timed bracketed calls on rotating input sets, each refilled right before its call once used.

    dsl (the candidate's): every call must have made at least one genuine call of that DSL (the harness counts
    them, knock.py), as every draw must; else a policy violation. A solve() can tell a timed call from a draw
    (the call count, the pool's buffers), and the speed would otherwise be torch's where the draws were the DSL's.
    work (evidence.Stream.work_floor(): DSL callable -> argument position -> the least bytes of tensors a draw passed
    there): every call must also call each of those callables with at least WORK_FRACTION of those bytes at each
    position (work_shortfall), or a decorative call on a sliver of the data (beside a large unused argument, say)
    would stand in for the draws' DSL work.

    An empty call (null: True, or "kernel" for one that launches a single one-element kernel) refills its
    set before every call unless refill is False, so that it carries what a timed call carries: the
    referee's own GPU work right before the bracket, which makes the harness's context wait for the GPU
    to switch back to it.
    """
    results, total = [], warmup + timed
    for k in range(total):
        s = k % pool.size
        if (s in pool.used and not null) or (null and refill):
            pool.refresh(s)
        result = bracket.call(k, s, null=null, flush=flush)
        if not null:
            pool.used.add(s)
        if not null and not result["copied"]:
            raise TimingError(f"timed call {k + 1} returned a different structure than the draws", "incorrect")
        made = result["dsl_calls"].get(dsl) if dsl is not None and not null else 1
        if not isinstance(made, int) or isinstance(made, bool) or made < 1:
            raise TimingError(f"timed call {k + 1} made no {dsl} call (every solve() call must run its {dsl} kernels, "
                              "the timed ones as the draws)", "policy_violation")
        short = work_shortfall(result["dsl_work"], work) if work and not null else None
        if short:
            raise TimingError(f"timed call {k + 1} {short} (every solve() call must run its DSL kernels on the data, "
                              "the timed ones as the draws)", "policy_violation")
        if on_done is not None and k >= warmup:
            on_done(k - warmup, s)
        if k >= warmup:
            results.append(result | {"set": s, "seed": pool.seeds[s]})
    return results


def work_shortfall(done: dict, floor: dict) -> str | None:
    """How a timed call's DSL work (the harness's dsl_work: callable -> argument position -> bytes of the tensors
    passed there, or for "n:<position>" the sum of the positive integers passed there: a launch size passed as a
    number) falls short of the draws' (floor, evidence.Stream.work_floor), or None."""
    done = with_all_callables(done, floor)
    for key, positions in floor.items():
        if not isinstance(done.get(key), dict):
            if key.endswith(evidence.ALL_CALLABLES):
                return f"called no {key[:-len(evidence.ALL_CALLABLES)]} callable, as every draw did"
            return f"did not call {key}, which every draw called"
        for position, least in positions.items():
            size = work_size(done, key, position)
            if size < WORK_FRACTION * least:
                what, where = ((f"numbers adding to {size}", position[2:]) if position.startswith("n:")
                               else (f"{size} bytes of tensors", position))
                return (f"passed {key} {what} as argument {where} where every draw passed at least {least} (the least "
                        f"a timed call may pass: {WORK_FRACTION:g}x)")
    return None


def with_all_callables(done: dict, floor: dict) -> dict:
    """done with, for each "<dsl>:*" key of floor (evidence.ALL_CALLABLES), the bytes of all that DSL's callables at
    each position added up, as work_floor adds up the draws'."""
    done = dict(done) if isinstance(done, dict) else {}
    for total in [k for k in floor if k.endswith(evidence.ALL_CALLABLES)]:
        prefix = total[:-len(evidence.ALL_CALLABLES)] + ":"
        called = [key for key, sizes in done.items() if isinstance(key, str) and key.startswith(prefix)
                  and not key.endswith(evidence.ALL_CALLABLES) and isinstance(sizes, dict)]
        if called:
            done[total] = {}
            for key in called:
                for position in done[key]:
                    done[total][position] = done[total].get(position, 0) + work_size(done, key, position)
    return done


def work_size(done: dict, key: str, position: str) -> int:
    """The bytes a timed call's dsl_work (as the harness sent it) gives callable `key` at `position`; 0 when absent or
    not a count."""
    sizes = done.get(key)
    size = sizes.get(position, 0) if isinstance(sizes, dict) else 0
    return size if isinstance(size, int) and not isinstance(size, bool) else 0


def summarize(results: list[dict], null: dict) -> dict:
    """Medians of one process's timed calls: its in-process figures and the referee's bracket.

    sync_ms is the primary figure (the original grader's window); self_ms is the window that stops when
    solve() returns (the judge's figure before issue #27); ms is the bracket with the cross-process
    overhead of an empty call (null) replaced by the in-process window of that empty call.
    """
    raw = statistics.median(r["ms"] for r in results)
    adjusted = [max(r["ms"] - null["ms"] + null["sync_ms"], null["sync_ms"]) for r in results]

    def median_of(key: str) -> float | None:
        found = [r[key] for r in results if r.get(key) is not None]
        return statistics.median(found) if found else None

    return {"ms": statistics.median(adjusted), "raw_ms": raw, "min_ms": min(adjusted), "max_ms": max(adjusted),
            "sync_ms": median_of("sync_ms"), "self_reported_ms": median_of("self_ms"), "n": len(results)}


def null_figures(results: list[dict]) -> dict:
    """The bracket and the in-process window of an empty call (medians): what summarize() takes away."""
    return {"ms": statistics.median(r["ms"] for r in results),
            "sync_ms": statistics.median(r.get("sync_ms") or 0.0 for r in results),
            "self_ms": statistics.median(r.get("self_ms") or 0.0 for r in results)}


def clocks() -> dict:
    """GPU clocks, temperature, power and performance state seen now (nvidia-smi)."""
    fields = ("clocks.sm", "clocks.mem", "clocks.max.sm", "clocks.max.mem", "temperature.gpu", "power.draw",
              "pstate")
    if shutil.which("nvidia-smi") is None:
        return {}
    visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    index = visible[torch.cuda.current_device()] if visible else str(torch.cuda.current_device())
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits",
                              "-i", index], capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return {}
    values = [v.strip() for v in out.splitlines()[0].split(",")] if out else []
    return dict(zip(fields, values))
