"""The declared DSL's share of the candidate's profiled device time per call (details.dsl_share, issue #24).

One call, from speed.py after the profiled calls: measure(profile, built, dsl). A kernel instance counts
for the DSL only when all of these hold:

- its name is a symbol the DSL runtime built in this grading (the stream's "built" evidence), and a
  plain identifier, as every CuTe DSL and TIRx kernel name is (ATen's templated names never are);
- its launch (the CUDA runtime or driver call the profiler correlates with it) happened inside a
  genuine DSL call (the hooks' `mkb_dsl` range) and outside every ATen operator: torch kernels that a
  kernel launches from inside a DSL call path (a callback, a DLPack conversion) sit inside an ATen
  operator and count as torch; a kernel the profiler saw without a launch record counts by its name;
- no instance of the same name was launched by an ATen operator (a DSL kernel named like one of
  torch's is not told apart from it, so neither counts).

The total is every kernel, memcpy and memset the profiled calls ran. The share is DSL time / total time,
over the profiled calls (the same calls for both, so it is also the mean per call's ratio of sums).

On CPU (the judge's test mode: TIRx on the llvm target) there is no device time; the share there is the time
inside genuine DSL calls that no ATen operator took, over the time of DSL calls and ATen operators together
(Python between them counts for neither), each part at its fastest profiled call. Work done outside torch
and the DSL (numpy on the host, say) is invisible to both measures.
"""

from __future__ import annotations

import re

from mkb.judge.referee.policy import origin

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
COUNTED = ("kernel", "gpu_memcpy", "gpu_memset")


def bare(name: str) -> str:
    """A profiler kernel name without `void ` and its signature."""
    return name.split("(")[0].strip().removeprefix("void ").strip()


def measure(profile: dict | None, built: dict[str, set[str]] | dict[str, list[str]], dsl: str) -> dict:
    """The share and how it was reached: share (None without a usable profile), per-call ms of the DSL's
    kernels and of all device work, ms per origin, and the DSL-named kernels that did not count, with why."""
    if (profile or {}).get("ok") and profile.get("cpu"):
        return _cpu(profile)
    instances = (profile or {}).get("instances") if (profile or {}).get("ok") else None
    if not instances:
        return {"share": None, "why": "no profile of solve()" if not profile else
                (profile.get("error") or "the profile recorded no kernels")}
    calls = max(len(profile.get("calls") or []), 1)
    symbols = {k: list(v) for k, v in built.items()}
    torch_launched = {i["name"] for i in instances if i.get("launch") == "aten"}
    total_us, dsl_us, by_origin, excluded = 0.0, 0.0, {}, {}
    for inst in instances:
        if inst.get("cat") not in COUNTED:
            continue
        dur = float(inst.get("dur") or 0.0)
        total_us += dur
        kind = origin(inst["name"], symbols) if inst.get("cat") == "kernel" else "torch"
        why = _excluded(inst, kind, dsl, torch_launched)
        if kind == dsl and why is None:
            dsl_us += dur
        elif kind == dsl:
            excluded.setdefault(inst["name"][:120], why)
            kind = "excluded"
        by_origin[kind] = by_origin.get(kind, 0.0) + dur
    return {"share": dsl_us / total_us if total_us > 0 else None,
            "dsl_ms": dsl_us / calls / 1e3, "total_ms": total_us / calls / 1e3, "calls": calls,
            "by_origin_ms": {k: v / calls / 1e3 for k, v in sorted(by_origin.items())},
            "excluded": [{"name": n, "why": w} for n, w in list(excluded.items())[:20]]}


def _cpu(profile: dict) -> dict:
    """On CPU (tests, CI): DSL time no ATen operator took / the time of DSL calls and ATen operators together,
    each part at its fastest profiled call. CPU time only ever gains noise (a page fault, a descheduled
    thread: one such call once made an eager-torch SwiGLU read 93% TIRx where its other calls read 30-37%), so
    the minimum of each part is its cost and the sum over calls is not. The parts' minimums may come from different
    calls, though: one DSL-only call lifted the share of two torch-heavy ones (each judged correct) to theirs; so the
    share is also at most the median call's own share, which one noisy call does not move either."""
    calls = [c for c in profile.get("calls") or [] if isinstance(c, dict)]
    if any(c.get("kernel_threads") for c in calls):  # the profiler saw one thread of several: no share to read
        return {"share": None, "basis": "cpu time", "calls": len(calls),
                "why": "a thread kernel.py started was running during a profiled call, and the CPU profiler records "
                       "the operators of its own thread only: the CPU share cannot be measured"}
    dsl = [float(c.get("dsl_us") or 0.0) for c in calls]
    other = [max(float(c.get("total_us") or 0.0) - d, 0.0) for c, d in zip(calls, dsl)]
    least = (min(dsl), min(other)) if calls else (0.0, 0.0)
    total = sum(least)
    n = max(len(calls), 1)
    per_call = sorted(d / (d + o) for d, o in zip(dsl, other) if d + o > 0)
    fastest = least[0] / total if total > 0 else None
    typical = per_call[(len(per_call) - 1) // 2] if per_call else None  # the median (the lower one of two)
    return {"share": min(fastest, typical) if fastest is not None and typical is not None else fastest,
            "basis": "cpu time (DSL calls vs ATen operators, each at its fastest call, and no more than the median "
                     "call's own share)",
            "per_call": per_call,
            "dsl_ms": sum(dsl) / n / 1e3, "total_ms": (sum(dsl) + sum(other)) / n / 1e3, "calls": len(calls),
            **({} if total > 0 else {"why": "neither a DSL call nor a torch operator ran in solve()"})}


def _excluded(inst: dict, kind: str, dsl: str, torch_launched: set[str]) -> str | None:
    if kind != dsl:
        return None
    if not IDENTIFIER.fullmatch(bare(inst["name"])):
        return "not a plain identifier (DSL kernels have one)"
    if inst.get("launch") == "aten":
        return "launched inside a torch operator"
    if inst.get("launch") == "other":
        return "launched outside every DSL call"
    if inst["name"] in torch_launched:
        return "a kernel of the same name was launched by a torch operator"
    return None
