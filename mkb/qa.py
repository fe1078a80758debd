"""Problem QA: run make_inputs and reference and check a problem is well posed (DESIGN §3)."""

from __future__ import annotations

import statistics
import time
from typing import Any

from pydantic import Field

from mkb.problems import load_module
from mkb.records import ProblemInfo, Record

SEED_A, SEED_B = 20261202, 74  # fixed seeds: QA must be reproducible run to run


class QaCheck(Record):
    """One named QA check of one problem."""

    name: str
    """determinism, structure, finite, non_degenerate, sensitivity, anchor, margin, no_mutation, ..."""
    ok: bool
    """Whether the check passed."""
    detail: str = ""
    """What was seen (the first failure, or a measured value)."""


class QaReport(Record):
    """QA of one problem at one scale on one device."""

    problem: str
    """Problem id (p07)."""
    scale: str
    """smoke or full."""
    device: str
    """cpu or cuda."""
    ok: bool
    """Every check passed."""
    checks: list[QaCheck] = Field(default_factory=list)
    """Each check, in order."""
    outputs: Any = None
    """Structure of the reference output (shapes, dtypes)."""
    inputs: Any = None
    """Structure of the inputs (shapes, dtypes)."""
    ref_rel_error: float | None = None
    """max over float outputs of max|ref-anchor| / max|anchor| (the reference's own error)."""
    eager_ms: float | None = None
    """Median eager reference time (CUDA events on GPU, wall clock on CPU)."""
    peak_mem_bytes: int | None = None
    """Peak device memory during make_inputs + reference (GPU only)."""
    fingerprint: str = ""
    """Fingerprint of the problem file that was checked."""


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _free(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.empty_cache()


def _draw(module, device: str, scale: str, seed: int):
    import torch

    torch.manual_seed(seed)
    return module.make_inputs(device=device, scale=scale)


def _time_reference(module, inputs, device: str, repeats: int) -> float:
    import torch

    times = []
    for _ in range(repeats):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            module.reference(*inputs)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            module.reference(*inputs)
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def check_problem(info: ProblemInfo, scale: str = "smoke", device: str = "cpu", timing_repeats: int = 5) -> QaReport:
    """Run every QA check of one problem; failures are data in the report, never exceptions."""
    import torch

    from mkb import tensortree as tt

    checks: list[QaCheck] = []
    extra: dict[str, Any] = {}

    def add(name: str, ok: bool, detail: str = "") -> bool:
        checks.append(QaCheck(name=name, ok=bool(ok), detail=detail))
        return ok

    def report() -> QaReport:
        return QaReport(problem=info.id, scale=scale, device=device, ok=all(c.ok for c in checks) and bool(checks),
                        checks=checks, fingerprint=info.fingerprint, **extra)

    with tt.strict_precision():
        try:
            module = load_module(info)
        except Exception as exc:  # an import failure is a QA finding
            add("import", False, str(exc))
            return report()
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        try:
            inputs = _draw(module, device, scale, SEED_A)
            snapshot = tt.clone(inputs)
            ref = module.reference(*inputs)
            _sync(device)
        except Exception as exc:
            add("runs", False, f"{type(exc).__name__}: {exc}")
            return report()
        if device == "cuda":
            extra["peak_mem_bytes"] = int(torch.cuda.max_memory_allocated())
        extra["inputs"] = tt.describe(list(inputs))
        extra["outputs"] = tt.describe(ref)
        add("no_mutation", tt.bitwise_equal(inputs, snapshot), "reference must not modify its inputs")
        inputs, snapshot = snapshot, None  # keep the pristine copy; full-scale sets are large
        _free(device)
        leaves = tt.flatten(ref)
        bad = [p for p, t in leaves if not isinstance(t, torch.Tensor)]
        add("structure", not bad and isinstance(ref, (torch.Tensor, tuple)),
            f"non-tensor leaves at {bad}" if bad else "a tensor or (nested) tuple of tensors")
        wrong_dev = [p for p, t in leaves if isinstance(t, torch.Tensor) and t.device.type != device]
        add("device", not wrong_dev, f"outputs not on {device}: {wrong_dev}" if wrong_dev else "")
        exact = [p for p, t in leaves if isinstance(t, torch.Tensor) and tt.is_exact_dtype(t.dtype)]
        if exact and not info.exact:
            add("exact_flag", False, f"integer outputs {exact} need EXACT = True")
        nonfinite = [p for p, t in leaves if isinstance(t, torch.Tensor) and t.dtype.is_floating_point
                     and not torch.isfinite(t).all()]
        add("finite", not nonfinite, f"NaN/Inf in {nonfinite}" if nonfinite else "")
        constant = [p for p, t in leaves if isinstance(t, torch.Tensor) and t.numel() > 1
                    and bool((t.reshape(-1) == t.reshape(-1)[0]).all())]
        add("non_degenerate", not constant, f"constant outputs {constant}" if constant else "")

        again = _draw(module, device, scale, SEED_A)
        same_inputs = tt.bitwise_equal(again, inputs)
        same_again = tt.bitwise_equal(module.reference(*again), ref)
        del again
        _free(device)
        repeat_same = tt.bitwise_equal(module.reference(*inputs), ref)
        add("determinism", same_inputs and repeat_same and same_again,
            "make_inputs gives different inputs for the same seed" if not same_inputs else
            "" if repeat_same else "reference gives different outputs on the same inputs (hidden randomness?)")

        other = _draw(module, device, scale, SEED_B)
        ref_other = module.reference(*other)
        insensitive = [p for (p, a), (_, b) in zip(leaves, tt.flatten(ref_other))
                       if isinstance(a, torch.Tensor) and a.shape == b.shape and tt.bitwise_equal(a, b)]
        add("sensitivity", not insensitive, f"unchanged under fresh inputs: {insensitive}" if insensitive else "")
        del other, ref_other
        _free(device)

        anchor = module.reference(*tt.to_anchor(inputs))
        _sync(device)
        mismatch = tt.structure_mismatch(_shape_only(anchor), _shape_only(ref))
        not64 = [p for (p, r), (_, a) in zip(leaves, tt.flatten(anchor))
                 if isinstance(r, torch.Tensor) and r.dtype.is_floating_point and a.dtype != torch.float64]
        add("anchor_float64", mismatch is None and not not64,
            mismatch or (f"anchor outputs not float64 at {not64}: make reference dtype-generic" if not64 else ""))
        rel = 0.0
        flips = []
        for (p, r), (_, a) in zip(leaves, tt.flatten(anchor)):
            if not isinstance(r, torch.Tensor) or r.shape != a.shape:
                continue
            if tt.is_exact_dtype(r.dtype):
                if not torch.equal(r.cpu(), a.cpu()):
                    flips.append(p)
            elif r.numel():
                scale_a = float(a.abs().max())
                if scale_a > 0:
                    rel = max(rel, float((r.double() - a.double()).abs().max()) / scale_a)
        extra["ref_rel_error"] = rel
        add("anchor_exact", not flips, f"integer outputs differ between native and fp64 runs: {flips}" if flips else "")
        if info.margin is not None and hasattr(module, "decision_margin"):
            margin = float(module.decision_margin(*inputs))
            add("margin", margin >= info.margin, f"decision margin {margin:.3g} (threshold {info.margin:g})")
        del anchor
        _free(device)
        if device == "cuda" or scale == "smoke":
            extra["eager_ms"] = _time_reference(module, inputs, device, timing_repeats)
        return report()


def _shape_only(obj):
    """Structure with dtypes erased (the anchor differs from the reference only in dtype)."""
    import torch

    if isinstance(obj, (tuple, list)):
        return type(obj)(_shape_only(o) for o in obj)
    if isinstance(obj, torch.Tensor):
        return torch.empty(obj.shape, dtype=torch.bool, device="meta")
    return obj


def check_problems(infos: list[ProblemInfo], scale: str = "smoke", device: str = "cpu"):
    """check_problem for each problem in turn, yielding (problem, report); the GPU cache is emptied between
    problems so one full-scale problem's buffers never crowd the next."""
    for info in infos:
        report = check_problem(info, scale=scale, device=device)
        _free(device)
        yield info, report
