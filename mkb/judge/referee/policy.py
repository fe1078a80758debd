"""Runtime policy (DESIGN §4): which kernels ran, whether the declared DSL mattered, what is forbidden.

Pure functions over what the referee collected: the evidence the candidate process streamed (findings,
DSL symbols, DSL calls per draw, entry points changed since the baseline), the knock-out's draws and, on
a GPU, the profiler's kernel list and the DSL's share of the device time (share.py). Kernels are
attributed to a DSL by the symbols its runtime built or loaded in this evaluation, never by name
patterns alone (a Triton kernel can carry any name).

Two DSL policies (DESIGN §5, issue #24): `paper` (the default, as the original benchmark: every call
runs the DSL and the DSL computes the answer; eager PyTorch may do the rest; the share is recorded, not
enforced) and `strict` (also: the DSL's share of the device time is at least STRICT_SHARE, or the
problem's own DSL_SHARE floor). On CPU, where the judge runs TIRx for tests, the share is the DSL's
share of CPU time (share.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mkb.judge.referee import knockout
from mkb.records import Check, Dsl, LaunchedKernel

TORCH_KERNEL_MARKERS = ("at::", "at_cuda_detail", "cub::", "cublas", "cublasLt", "nvjet", "xmma", "gemm",
                        "gemv", "cutlass::", "cudnn", "Memcpy", "Memset", "splitK", "sm90_", "sm80_",
                        "ampere_", "flash", "fmha", "elementwise_kernel", "reduce_kernel", "CatArrayBatched",
                        "indexSelect", "softmax", "vectorized", "unrolled_elementwise", "distribution_",
                        "triu_tril", "scatter_gather", "radixSort", "gatherTopK", "bitonicSort")
"""Substrings of kernels that PyTorch (ATen, cuBLAS, cuDNN, CUB) launches for eager ops."""


POLICIES = ("paper", "strict")
STRICT_SHARE = 0.9
"""The strict policy's floor on the DSL's share of device time (a problem's DSL_SHARE may lower it)."""


@dataclass
class Evidence:
    """What the referee gathered about the DSL use of one kernel."""

    dsl: Dsl
    device: str
    draw_calls: list[dict[str, int]] = field(default_factory=list)
    knockout: dict | None = None
    """The knock-out's draws (knockout.py); None where no DSL can run (CuTe DSL on CPU)."""
    report: dict = field(default_factory=dict)
    """The evidence stream's summary: built, findings, patched, forbidden_modules."""
    profile: dict | None = None
    share: dict | None = None
    """share.measure()'s result (GPU, after timing)."""
    policy: str = "paper"
    share_min: tuple[float, str] = (STRICT_SHARE, "")
    """The strict policy's floor and, when the problem set it, the reason."""


@dataclass
class Verdict:
    """The policy outcome: violations (if any), the DSL check and the sub-checks behind it."""

    violations: list[str]
    dsl_check: Check
    checks: dict[str, str]
    kernels: list[LaunchedKernel]
    policy: str = "paper"
    message: str = ""
    """Why the DSL check failed (for the first failed sub-check), in the agent's terms."""


def other(dsl: Dsl) -> Dsl:
    return Dsl.TIRX if Dsl(dsl) == Dsl.CUTEDSL else Dsl.CUTEDSL


def origin(name: str, built: dict[str, list[str]]) -> str:
    """cutedsl / tirx when a DSL runtime built the symbol in this evaluation; else torch or other."""
    for dsl in (Dsl.CUTEDSL, Dsl.TIRX):
        if any(_same_symbol(name, symbol) for symbol in built.get(str(dsl), ())):
            return str(dsl)
    if name.startswith("triton_"):
        return "triton"
    if any(marker in name for marker in TORCH_KERNEL_MARKERS):
        return "torch"
    return "other"


def _same_symbol(name: str, symbol: str) -> bool:
    """A profiler kernel name against a symbol the DSL built (demangled names carry a signature)."""
    bare = name.split("(")[0].strip().removeprefix("void ").strip()
    return bool(symbol) and (bare == symbol or name == symbol or (len(symbol) >= 16 and symbol in name))


def launched_kernels(profile: dict | None, built: dict[str, list[str]], calls: int) -> list[LaunchedKernel]:
    """The profiler's kernels of solve(), attributed, with device time per profiled call."""
    if not profile:
        return []
    return [LaunchedKernel(name=k["name"], count=k["count"], device_ms=k["device_us"] / 1e3 / max(calls, 1),
                           origin=origin(k["name"], built)) for k in profile.get("kernels", [])]


def judge(evidence: Evidence) -> Verdict:
    """Violations and the DSL-use verdict for one evaluation."""
    dsl, report = Dsl(evidence.dsl), evidence.report
    built = {k: list(v) for k, v in report.get("built", {}).items()}
    violations = list(report.get("findings", []))
    violations += [f"replaced {name} (patching library or judge entry points is forbidden)"
                   for name in report.get("patched", [])[:5]]
    violations += [f"imported {m} (another GPU language)" for m in report.get("forbidden_modules", [])]
    if any(calls.get(str(other(dsl)), 0) for calls in evidence.draw_calls) or built.get(str(other(dsl))):
        violations.append(f"ran code compiled by {other(dsl)}, the other DSL")
    calls_profiled = len((evidence.profile or {}).get("calls", [])) or 1
    kernels = launched_kernels(evidence.profile, built, calls_profiled)
    for k in kernels:
        if k.origin in (str(other(dsl)), "triton"):
            violations.append(f"launched {k.name} ({k.origin})")
    if evidence.profile and evidence.profile.get("escaped"):
        violations.append("kernels kept running after solve() returned, outside the ordered stream "
                          f"(unjoined side-stream work): {', '.join(evidence.profile['escaped'][:3])}")
    checks = _dsl_checks(evidence)
    required = {k: v for k, v in checks.items()
                if (k != "trace" or evidence.device == "cuda") and (k != "share" or evidence.policy == "strict")}
    return Verdict(violations=_unique(violations), dsl_check=_overall(required), checks=checks, kernels=kernels,
                   policy=evidence.policy, message=dsl_failure_message(str(evidence.dsl), checks, evidence))


def _dsl_checks(evidence: Evidence) -> dict[str, str]:
    dsl = str(evidence.dsl)
    if evidence.device != "cuda" and Dsl(dsl) == Dsl.CUTEDSL:
        return {"calls": Check.NOT_CHECKED, "knockout": Check.NOT_CHECKED, "trace": Check.NOT_CHECKED,
                "share": Check.NOT_CHECKED}
    every_call = bool(evidence.draw_calls) and all(c.get(dsl, 0) >= 1 for c in evidence.draw_calls)
    checks = {"calls": Check.PASSED if every_call else Check.FAILED, "knockout": knockout.check(evidence.knockout)}
    share = evidence.share
    if evidence.device != "cuda" or share is None:
        checks["trace"] = Check.NOT_CHECKED
    else:  # a profile that could not be taken is no excuse: a kernel can fail on purpose while profiled
        checks["trace"] = Check.PASSED if share.get("share") else Check.FAILED
    if evidence.policy != "strict" or share is None:
        checks["share"] = Check.NOT_CHECKED
    else:
        checks["share"] = Check.PASSED if (share.get("share") or 0.0) >= evidence.share_min[0] else Check.FAILED
    return {k: str(v) for k, v in checks.items()}


def _overall(checks: dict[str, str]) -> Check:
    values = set(checks.values())
    if Check.FAILED in values:
        return Check.FAILED
    return Check.NOT_CHECKED if Check.NOT_CHECKED in values else Check.PASSED


def dsl_failure_message(dsl: str, checks: dict[str, str], evidence: Evidence | None = None) -> str:
    """Why the DSL-use check failed, in the agent's terms ('' when nothing failed)."""
    if checks.get("calls") == Check.FAILED:
        return f"no {dsl}-compiled function ran during every solve() call: the kernel must launch a {dsl} kernel"
    if checks.get("knockout") == Check.FAILED:
        return knockout.failure_message(dsl, (evidence.knockout if evidence else None) or {})
    share = (evidence.share if evidence else None) or {}
    if checks.get("trace") == Check.FAILED:
        why = share.get("why") or "no kernel built by it ran inside its own calls"
        return f"the profiler saw no {dsl} kernel do any of solve()'s device work ({why})"
    if checks.get("share") == Check.FAILED:
        floor, reason = evidence.share_min
        basis = "CPU time" if str(share.get("basis", "")).startswith("cpu") else "device time"
        if share.get("share") is None:  # a profile without a share is no excuse under strict (a kernel can fail it)
            return (f"the strict policy needs the {dsl} kernels' share of solve()'s {basis}, and the profile gave none "
                    f"({share.get('why') or 'no time was measured'}): the share must reach {floor:.0%}")
        return (f"the {dsl} kernels did {share['share']:.1%} of solve()'s {basis}, below the strict "
                f"policy's {floor:.0%}{f' ({reason})' if reason else ''}: move more of the work into {dsl} "
                f"(paper policy: the share is recorded, not enforced)")
    return ""


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))
