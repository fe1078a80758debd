"""Problem QA: run make_inputs and reference and check a problem is well posed (DESIGN §3)."""

from __future__ import annotations

import statistics
import time
from typing import Any

from pydantic import Field

from mkb import inplace
from mkb import tensortree as tt
from mkb.problems import load_module, mutated_positions
from mkb.records import ProblemInfo, Record

SEED_A, SEED_B = 20261202, 74  # fixed seeds: QA must be reproducible run to run


class QaCheck(Record):
    """One named QA check of one problem."""

    name: str
    """determinism, structure, finite, non_degenerate, sensitivity, anchor, margin, no_mutation, inplace_*, ..."""
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


def _time_reference(module, inputs, positions, device: str, repeats: int) -> float:
    """Median time of reference(*inputs); each call gets fresh copies of the MUTATES inputs (made untimed)."""
    import torch

    times = []
    for _ in range(repeats):
        work = list(inputs)
        for i, _ in positions:
            work[i] = inputs[i].clone()
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            module.reference(*work)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            module.reference(*work)
            times.append((time.perf_counter() - t0) * 1e3)
        del work
    return statistics.median(times)


def check_problem(info: ProblemInfo, scale: str = "smoke", device: str = "cpu", timing_repeats: int = 5) -> QaReport:
    """Run every QA check of one problem; failures are data in the report, never exceptions."""
    import torch

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
        positions = mutated_positions(info, module.reference)

        def answer(inputs, copy=True):
            return inplace.run(module.reference, inputs, positions, copy=copy)

        def leaves(ans):
            return inplace.leaves(ans, positions)

        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        try:
            inputs = _draw(module, device, scale, SEED_A)
            snapshot = tt.clone(inputs)
            ref = answer(inputs)
            _sync(device)
        except Exception as exc:
            add("runs", False, f"{type(exc).__name__}: {exc}")
            return report()
        if device == "cuda":
            extra["peak_mem_bytes"] = int(torch.cuda.max_memory_allocated())
        extra["inputs"] = tt.describe(list(inputs))
        extra["outputs"] = tt.describe(ref[0])
        add("no_mutation", tt.bitwise_equal(inputs, snapshot),
            "reference must not modify its inputs" + (" other than MUTATES" if positions else ""))
        if positions:
            _check_inplace(add, module, inputs, ref, positions, scale, device)
        inputs, snapshot = snapshot, None  # keep the pristine copy; full-scale sets are large
        _free(device)
        returned = ref[0]
        bad = [p for p, t in tt.flatten(returned) if not isinstance(t, torch.Tensor)]
        allowed = isinstance(returned, (torch.Tensor, tuple)) or (returned is None and positions)
        add("structure", (not bad or returned is None) and allowed,
            f"non-tensor leaves at {bad}" if bad and returned is not None else
            "a tensor or (nested) tuple of tensors" + (", or None (only in-place outputs)" if positions else ""))
        found = leaves(ref)
        wrong_dev = [p for p, t in found if t.device.type != device]
        add("device", not wrong_dev, f"outputs not on {device}: {wrong_dev}" if wrong_dev else "")
        exact = [p for p, t in found if tt.is_exact_dtype(t.dtype)]
        if exact and not info.exact:
            add("exact_flag", False, f"integer outputs {exact} need EXACT = True")
        nonfinite = [p for p, t in found if t.dtype.is_floating_point and not torch.isfinite(t).all()]
        add("finite", not nonfinite, f"NaN/Inf in {nonfinite}" if nonfinite else "")
        constant = [p for p, t in found if t.numel() > 1 and bool((t.reshape(-1) == t.reshape(-1)[0]).all())]
        add("non_degenerate", not constant, f"constant outputs {constant}" if constant else "")

        again = _draw(module, device, scale, SEED_A)
        same_inputs = tt.bitwise_equal(again, inputs)
        same_again = tt.bitwise_equal(answer(again), ref)
        del again
        _free(device)
        repeat_same = tt.bitwise_equal(answer(inputs), ref)
        add("determinism", same_inputs and repeat_same and same_again,
            "make_inputs gives different inputs for the same seed" if not same_inputs else
            "" if repeat_same else "reference gives different outputs on the same inputs (hidden randomness?)")

        other = _draw(module, device, scale, SEED_B)
        ref_other = answer(other)
        insensitive = [p for (p, a), (_, b) in zip(found, leaves(ref_other))
                       if a.shape == b.shape and tt.bitwise_equal(a, b)]
        add("sensitivity", not insensitive, f"unchanged under fresh inputs: {insensitive}" if insensitive else "")
        if positions:
            _check_inplace_sensitivity(add, answer, inputs, other, ref, positions)
        del other, ref_other
        _free(device)

        anchor = answer(tt.to_anchor(inputs), copy=False)
        _sync(device)
        mismatch = tt.structure_mismatch(_shape_only(anchor), _shape_only(ref))
        anchored = leaves(anchor)
        # with no f16/bf16/f32 input (p23: fp8 bytes and a Python float) the anchor is the native run itself
        upcast = any(isinstance(t, torch.Tensor) and t.dtype in tt.UPCAST_DTYPES for t in inputs)
        not64 = [p for (p, r), (_, a) in zip(found, anchored)
                 if upcast and r.dtype.is_floating_point and a.dtype != torch.float64]
        add("anchor_float64", mismatch is None and not not64,
            mismatch or (f"anchor outputs not float64 at {not64}: make reference dtype-generic" if not64 else ""))
        rel = 0.0
        flips = []
        for (p, r), (_, a) in zip(found, anchored):
            if r.shape != a.shape:
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
            extra["eager_ms"] = _time_reference(module, inputs, positions, device, timing_repeats)
        return report()


def _check_inplace(add, module, inputs, ref, positions, scale: str, device: str) -> None:
    """MUTATES inputs are tensors the reference really changes, and nothing it returns aliases an input."""
    import torch

    not_tensors = [name for i, name in positions if not isinstance(inputs[i], torch.Tensor)]
    if not add("inplace_tensors", not not_tensors,
               f"MUTATES inputs that are not tensors: {not_tensors}" if not_tensors else ""):
        return
    unchanged = [name for (i, name), t in zip(positions, ref[1]) if tt.bitwise_equal(t, inputs[i])]
    add("inplace_changed", not unchanged,
        f"reference left {unchanged} unchanged: update MUTATES inputs in place" if unchanged else "")
    shared = inplace.aliased(ref[0], list(inputs) + list(ref[1]))
    add("no_alias", not shared, f"returned {shared} share memory with an input: return new tensors" if shared else "")


def _check_inplace_sensitivity(add, answer, inputs, other, ref, positions) -> None:
    """The in-place update depends on the other inputs: A's MUTATES inputs with B's other inputs update differently."""
    import torch

    mutated = {i for i, _ in positions}
    if not any(isinstance(t, torch.Tensor) for j, t in enumerate(other) if j not in mutated):
        return
    mixed = [inputs[j] if j in mutated else t for j, t in enumerate(other)]
    try:
        updated = answer(mixed)[1]
    except Exception as exc:  # inputs coupled across arguments: the check cannot mix draws
        add("inplace_sensitivity", False, f"reference failed on mixed draws: {type(exc).__name__}: {exc}")
        return
    same = [name for (_, name), a, b in zip(positions, updated, ref[1]) if tt.bitwise_equal(a, b)]
    add("inplace_sensitivity", not same,
        f"in-place outputs {same} ignore the other inputs (same update under fresh non-MUTATES inputs)" if same else "")


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
