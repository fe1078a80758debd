"""Runtime policy (DESIGN §4): which kernels ran, whether the declared DSL mattered, what is forbidden.

Pure functions over what the referee collected: the candidate process's report (hook findings,
DSL symbols, patched entry points), the per-call DSL counts, the knock-out comparison and, on a
GPU, the profiler's kernel list. Kernels are attributed to a DSL by the symbols its runtime built
or loaded in this evaluation, never by name patterns alone (a Triton kernel can carry any name).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mkb.records import Check, Dsl, LaunchedKernel

TORCH_KERNEL_MARKERS = ("at::", "at_cuda_detail", "cub::", "cublas", "cublasLt", "nvjet", "xmma", "gemm",
                        "gemv", "cutlass::", "cudnn", "Memcpy", "Memset", "splitK", "sm90_", "sm80_",
                        "ampere_", "flash", "fmha", "elementwise_kernel", "reduce_kernel", "CatArrayBatched",
                        "indexSelect", "softmax", "vectorized", "unrolled_elementwise", "distribution_",
                        "triu_tril", "scatter_gather", "radixSort", "gatherTopK", "bitonicSort")
"""Substrings of kernels that PyTorch (ATen, cuBLAS, cuDNN, CUB) launches for eager ops."""


@dataclass
class Evidence:
    """What the referee gathered about the DSL use of one kernel."""

    dsl: Dsl
    device: str
    draw_calls: list[dict[str, int]] = field(default_factory=list)
    knockout_changed: bool | None = None
    report: dict = field(default_factory=dict)
    profile: dict | None = None


@dataclass
class Verdict:
    """The policy outcome: violations (if any), the DSL check and the sub-checks behind it."""

    violations: list[str]
    dsl_check: Check
    checks: dict[str, str]
    kernels: list[LaunchedKernel]


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
    for k, v in report.get("called", {}).items():
        built.setdefault(k, []).extend(v)
    violations = list(report.get("findings", []))
    violations += [f"replaced {name} (patching library or judge entry points is forbidden)"
                   for name in report.get("patched", [])]
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
    checks = _dsl_checks(evidence, kernels)
    required = {k: v for k, v in checks.items() if k != "trace" or evidence.device == "cuda"}
    return Verdict(violations=_unique(violations), dsl_check=_overall(required), checks=checks, kernels=kernels)


def _dsl_checks(evidence: Evidence, kernels: list[LaunchedKernel]) -> dict[str, str]:
    dsl = str(evidence.dsl)
    if evidence.device != "cuda" and Dsl(dsl) == Dsl.CUTEDSL:
        return {"calls": Check.NOT_CHECKED, "knockout": Check.NOT_CHECKED, "trace": Check.NOT_CHECKED}
    every_call = bool(evidence.draw_calls) and all(c.get(dsl, 0) >= 1 for c in evidence.draw_calls)
    checks = {"calls": Check.PASSED if every_call else Check.FAILED,
              "knockout": Check.NOT_CHECKED if evidence.knockout_changed is None
              else Check.PASSED if evidence.knockout_changed else Check.FAILED}
    if evidence.device != "cuda":
        checks["trace"] = Check.NOT_CHECKED
    elif evidence.profile is None:
        checks["trace"] = Check.NOT_CHECKED
    else:
        checks["trace"] = Check.PASSED if any(k.origin == dsl for k in kernels) else Check.FAILED
    return {k: str(v) for k, v in checks.items()}


def _overall(checks: dict[str, str]) -> Check:
    values = set(checks.values())
    if Check.FAILED in values:
        return Check.FAILED
    return Check.NOT_CHECKED if Check.NOT_CHECKED in values else Check.PASSED


def dsl_failure_message(dsl: str, checks: dict[str, str]) -> str:
    """Why the DSL-use check failed, in the agent's terms."""
    if checks.get("calls") == Check.FAILED:
        return f"no {dsl}-compiled function ran during every solve() call: the kernel must launch a {dsl} kernel"
    if checks.get("knockout") == Check.FAILED:
        return (f"knocking out the {dsl} calls left every returned tensor unchanged: the {dsl} kernel is "
                f"decorative; a returned tensor must depend on it")
    return f"the profiler saw no kernel built by {dsl} during solve()"


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))
