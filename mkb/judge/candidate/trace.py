"""Profiler traces of solve(): which GPU kernels ran, on which stream, for how long, launched from where.

Standard library and torch only (runs in the candidate process, loaded by path). Each profiled
call is bracketed by a `mkb_solve` range, followed by a one-kernel `mkb_marker` on the current
stream; a solve kernel that ends after the marker starts ran outside the ordered stream (unjoined
side-stream work that the timed window would miss). Every genuine DSL call runs inside an `mkb_dsl`
range (knock.py), and each kernel instance is reported with where its launch happened: inside an
ATen operator ("aten"), inside a DSL call ("dsl"), elsewhere ("other"), or unknown (no launch record):
the referee's share.py counts the DSL's device time from that.
"""

from __future__ import annotations

import bisect
import json
import os
from typing import Any, Callable

import torch

LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
BOOKKEEPING = frozenset(f"aten::{name}" for name in (
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "ones", "full", "zeros_like",
    "ones_like", "full_like", "clone", "to", "contiguous", "view", "reshape", "_reshape_alias", "as_strided",
    "detach", "alias", "lift_fresh", "resolve_conj", "resolve_neg", "_unsafe_view", "expand", "permute", "t",
    "transpose", "select", "slice", "narrow", "squeeze", "unsqueeze", "split", "chunk", "unbind"))
"""ATen operators that allocate, alias or only wrap another operator (its copy_ or fill_ is an event of its own):
on CPU they are no one's compute."""


def _profiler(device: str | None):
    """torch's Kineto profiler without the torch.profiler wrapper.

    torch.profiler.profile imports torch._inductor on first use (and with it dynamo, sympy and
    Triton): 3.3-6.1 s per judge process on the H200, on the critical path of every grading. The
    autograd profiler underneath records the same Kineto trace and imports nothing.
    """
    return torch.autograd.profiler.profile(use_cpu=True, use_device=device, use_kineto=True)


def warm_up() -> None:
    """Run the profiler once on the CPU, so that whatever it sets up lazily happens before the integrity snapshot."""
    with _profiler(None):
        pass


def profile_calls(solve: Callable[[], Any], calls: int, workdir: str, sync: Callable[[], None],
                  before: Callable[[], None] = lambda: None, device: str = "cuda",
                  threads: Callable[[], tuple[int, int]] = lambda: (0, 0)) -> dict:
    """Run solve() `calls` times under the Kineto profiler; return kernels and per-call summaries.

    before() runs ahead of every call, outside the solve ranges (it puts in-place inputs back as drawn).
    On CPU there are no kernels: the summary is the DSL's and ATen's time (summarize_cpu).
    """
    if device == "cpu":
        shared = []
        with _profiler(None) as prof:
            for _ in range(calls):
                before()
                started, running = threads()
                with torch.profiler.record_function("mkb_solve"):
                    solve()
                now = threads()
                shared.append(running > 0 or now[1] > 0 or now[0] != started)
        return summarize_cpu(_events(prof, workdir), shared)
    marker = torch.zeros(1, device="cuda")
    sync()
    with _profiler("cuda") as prof:
        for _ in range(calls):
            before()
            with torch.profiler.record_function("mkb_solve"):
                solve()
            with torch.profiler.record_function("mkb_marker"):
                marker.add_(1)
            sync()
    return summarize(_events(prof, workdir))


def _events(prof, workdir: str) -> list[dict]:
    path = os.path.join(workdir, "trace.json")
    prof.export_chrome_trace(path)
    with open(path) as fh:
        events = json.load(fh).get("traceEvents", [])
    os.unlink(path)
    return events


def summarize_cpu(events: list[dict], shared: list[bool] | None = None) -> dict:
    """On CPU, per profiled call: the time inside genuine DSL calls that no computing ATen operator took (dsl_us),
    and the time of DSL calls and computing ATen operators together (total_us); their ratio is the share.
    kernel_threads: a Python thread kernel.py started ran during the call (escape.track_threads), whose operators
    the profiler (it records its own thread's) did not see."""
    def spans(name: str) -> list[tuple[float, float]]:
        return [(e["ts"], e["ts"] + e.get("dur", 0)) for e in events
                if e.get("cat") == "user_annotation" and e.get("name") == name]

    dsl = spans("mkb_dsl")
    aten = [(e["ts"], e["ts"] + e.get("dur", 0)) for e in events if e.get("cat") == "cpu_op"
            and str(e.get("name", "")).startswith("aten::") and e.get("name") not in BOOKKEEPING]
    calls = []
    for start, end in sorted(spans("mkb_solve")):
        inside = lambda found: [(max(a, start), min(b, end)) for a, b in found if a < end and b > start]  # noqa: E731
        ops, both = busy_us(inside(aten)), busy_us(inside(dsl) + inside(aten))
        calls.append({"dsl_us": both - ops, "total_us": both, "span_us": end - start})
    for call, flag in zip(calls, shared or []):
        call["kernel_threads"] = bool(flag)
    return {"calls": calls, "cpu": True}


class Spans:
    """Is a time inside any of these (possibly nested) intervals? Sorted starts, running maximum of ends."""

    def __init__(self, intervals: list[tuple[float, float]]):
        intervals = sorted(intervals)
        self.starts = [start for start, _ in intervals]
        self.reach, furthest = [], float("-inf")
        for _, end in intervals:
            furthest = max(furthest, end)
            self.reach.append(furthest)

    def __contains__(self, ts: float) -> bool:
        i = bisect.bisect_right(self.starts, ts) - 1
        return i >= 0 and self.reach[i] >= ts


def summarize(events: list[dict]) -> dict:
    """Kernels launched inside mkb_solve ranges, per call, with escape, span and launch facts."""
    ranges = sorted((e["ts"], e["ts"] + e.get("dur", 0), e["name"]) for e in events
                    if e.get("cat") == "user_annotation" and e.get("name") in ("mkb_solve", "mkb_marker"))
    dsl_calls = Spans([(e["ts"], e["ts"] + e.get("dur", 0)) for e in events
                       if e.get("cat") == "user_annotation" and e.get("name") == "mkb_dsl"])
    aten_ops = Spans([(e["ts"], e["ts"] + e.get("dur", 0)) for e in events
                      if e.get("cat") == "cpu_op" and str(e.get("name", "")).startswith("aten::")])
    launches = {}
    for e in events:
        if e.get("cat") in LAUNCH_CATEGORIES and "correlation" in e.get("args", {}):
            launches[e["args"]["correlation"]] = e["ts"]
    kernels = []
    for e in events:
        if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        launched = launches.get(e.get("args", {}).get("correlation"))
        owner = _owner(ranges, launched) if launched is not None else _latest(ranges, e["ts"])
        if owner is None:
            continue
        where = None if launched is None else "aten" if launched in aten_ops else "dsl" if launched in dsl_calls \
            else "other"
        kernels.append({"name": e.get("name", "?"), "stream": e.get("args", {}).get("stream"),
                        "ts": e["ts"], "dur": e.get("dur", 0), "range": owner, "cat": e.get("cat"), "launch": where})
    return _per_call(kernels)


def _owner(ranges: list[tuple], ts: float | None) -> tuple | None:
    if ts is None:
        return None
    for start, end, name in ranges:
        if start <= ts <= end:
            return (start, name)
    return None


def _latest(ranges: list[tuple], ts: float) -> tuple | None:
    """The solve call a kernel without a launch record belongs to: the last mkb_solve that began before it.

    Each profiled call ends with a device synchronisation, so a call's kernels all run before the
    next call begins; the judge's own marker kernels are torch launches and always correlate.
    """
    started = [(start, name) for start, _, name in ranges if start <= ts and name == "mkb_solve"]
    return started[-1] if started else None


def busy_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of (start, end) intervals: device time with concurrent kernels counted once."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def _per_call(kernels: list[dict]) -> dict:
    solve_ranges = sorted({k["range"][0] for k in kernels if k["range"][1] == "mkb_solve"})
    markers = sorted((k["range"][0], k) for k in kernels if k["range"][1] == "mkb_marker")
    calls, escaped = [], []
    for start in solve_ranges:
        mine = [k for k in kernels if k["range"] == (start, "mkb_solve")]
        marker = next((m for s, m in markers if s > start), None)
        first, last = min(k["ts"] for k in mine), max(k["ts"] + k["dur"] for k in mine)
        calls.append({"kernels": len(mine), "device_us": sum(k["dur"] for k in mine if k["cat"] == "kernel"),
                      "busy_us": busy_us([(k["ts"], k["ts"] + k["dur"]) for k in mine if k["cat"] == "kernel"]),
                      "span_us": last - first})
        if marker is not None:
            escaped += [k["name"] for k in mine
                        if k["stream"] != marker["stream"] and k["ts"] + k["dur"] > marker["ts"] + 1.0]
    call_of = {start: i for i, start in enumerate(solve_ranges)}
    instances = [{"name": k["name"], "cat": k["cat"], "dur": k["dur"], "launch": k["launch"],
                  "call": call_of[k["range"][0]]} for k in kernels if k["range"][1] == "mkb_solve"]
    names: dict[str, dict] = {}
    for k in kernels:
        if k["range"][1] != "mkb_solve" or k["cat"] != "kernel":
            continue
        entry = names.setdefault(k["name"], {"name": k["name"], "count": 0, "device_us": 0.0, "streams": []})
        entry["count"] += 1
        entry["device_us"] += k["dur"]
        if k["stream"] not in entry["streams"]:
            entry["streams"].append(k["stream"])
    return {"calls": calls, "kernels": list(names.values()), "escaped": sorted(set(escaped)), "instances": instances}
