"""What the judge holds for one problem, measured at full scale on a small host: inputs, answers, the fp64 anchor.

The referee's GPU need is set by the problem (referee/memory.py). To know it before a GPU does, this module
runs make_inputs, the reference and the fp64 anchor (tensortree.to_anchor, then the reference in float64)
under a torch dispatch mode that counts the bytes of every tensor created, live and at the peak. Tensors
that would not fit on a small host (above BIG_BYTES) and the products of heavy matrix work (above
HEAVY_FLOPS) are made on the meta device, which has shapes but no data, so their cost is counted, not paid;
everything small runs for real, so that routing, page tables and redraw loops take their real paths. An
operation that needs the values of a meta tensor (a data-dependent size on a big tensor) makes the problem
untraceable here (Untraceable); measure it on a GPU instead (details.memory of a grading).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from mkb import inplace
from mkb import tensortree as tt
from mkb.judge.referee import memory, timing
from mkb.judge.referee.transport import keep_on_device
from mkb.problems import load_module, mutated_positions
from mkb.records import ProblemInfo

BIG_BYTES = 1 << 30
HEAVY_FLOPS = 2e10
_MATMULS = {"mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul", "linear", "_scaled_mm", "convolution"}


class Untraceable(Exception):
    """An operation needed the values of a tensor that only exists as a shape here."""


class Tracer(TorchDispatchMode):
    """Counts the bytes of every storage created under it (live, peak, peak per phase)."""

    def __init__(self):
        super().__init__()
        self.live, self.peak, self.phase_peaks, self.phase = 0, 0, {}, "start"
        self._refs: dict[int, list[int]] = {}

    def mark(self, phase: str) -> None:
        """Start a phase: its peak counts from what is live now."""
        self.phase, self.phase_peaks[phase] = phase, self.live

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
        if any(t.is_meta for t in leaves):
            out = _on_meta(func, args, kwargs)
            if _writes_self(func) and not args[0].is_meta:
                return args[0]  # a small real tensor updated from a big one: its values do not matter here
        else:
            try:
                trial = _on_meta(func, args, kwargs)
            except Untraceable:  # a data-dependent operation on small tensors: run it
                trial = None
            heavy = trial is not None and (_bytes(trial) > BIG_BYTES or _flops(func, args, trial) > HEAVY_FLOPS)
            out = trial if heavy and not _writes_self(func) else func(*args, **kwargs)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._track(t)
        return out

    def _track(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key = storage._cdata
        if key in self._refs:
            self._refs[key][1] += 1
        else:
            self._refs[key] = [storage.nbytes(), 1]
            self.live += storage.nbytes()
            self.peak = max(self.peak, self.live)
            self.phase_peaks[self.phase] = max(self.phase_peaks.get(self.phase, 0), self.live)
        weakref.finalize(t, self._drop, key)

    def _drop(self, key: int) -> None:
        entry = self._refs[key]
        entry[1] -= 1
        if entry[1] == 0:
            self.live -= entry[0]
            del self._refs[key]


def _on_meta(func, args, kwargs):
    meta = lambda x: x.to("meta") if isinstance(x, torch.Tensor) else x  # noqa: E731
    kwargs = {k: ("meta" if k == "device" else v) for k, v in kwargs.items()}
    try:
        return func(*tree_map(meta, args), **tree_map(meta, kwargs))
    except Exception as exc:  # no meta kernel, or the values are needed: torch raises several kinds
        raise Untraceable(f"{func}: {str(exc).splitlines()[0][:200]}") from None


def _writes_self(func) -> bool:
    schema = func._schema
    return bool(schema.arguments) and schema.arguments[0].alias_info is not None and \
        schema.arguments[0].alias_info.is_write


def _bytes(out) -> int:
    return sum(t.untyped_storage().nbytes() for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))


def _flops(func, args, out) -> float:
    if func._schema.name.split("::")[-1] not in _MATMULS:
        return 0.0
    shapes = [t.shape for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor)]
    inner = max((s[-1] for s in shapes if len(s)), default=1)
    return 2.0 * sum(t.numel() for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)) * inner


@dataclass(frozen=True)
class Footprint:
    """One draw of a problem as the referee makes it (bytes)."""

    problem: str
    input_set: int
    answer: int
    anchor_answer: int
    draw_peak: int
    """Live at the peak of making the inputs, the reference and the fp64 anchor (inputs included)."""
    reference_peak: int
    anchor_peak: int
    """Live at the peak while the anchor ran (inputs, reference answer, float64 copies and their transients)."""

    def need(self, free_bytes: int, device_bytes: int) -> int:
        """The judge's claim for this problem (memory.need) on a device of device_bytes, with the pool sized against
        free_bytes, draws judged where the referee would judge them (transport.keep_on_device)."""
        place = "cuda" if keep_on_device(self.answer * 2 + self.anchor_answer + self.input_set, device_bytes) else "cpu"
        return memory.need(self.draw_peak, self.input_set, memory.answers_on_gpu(self.answer, self.anchor_answer, place),
                           timing.pool_size(self.input_set, free_bytes))


def measure(info: ProblemInfo, scale: str = "full", seed: int = 0) -> Footprint:
    """Make one draw of the problem under the tracer, as the referee does (raises Untraceable)."""
    module = load_module(info)
    positions = mutated_positions(info, module.reference)
    tracer = Tracer()
    with torch.no_grad(), tracer:
        torch.manual_seed(seed)
        tracer.mark("inputs")
        inputs = module.make_inputs(device="cpu", scale=scale)
        tracer.mark("reference")
        ref = inplace.run(module.reference, inputs, positions)
        tracer.mark("anchor")
        anchor = inplace.run(module.reference, tt.to_anchor(inputs), positions, copy=False)
    storages = {t.untyped_storage()._cdata: t.untyped_storage().nbytes()
                for t in tree_flatten(inputs)[0] if isinstance(t, torch.Tensor)}
    return Footprint(problem=info.id, input_set=sum(storages.values()), answer=tt.nbytes(ref),
                     anchor_answer=tt.nbytes(anchor), draw_peak=tracer.peak,
                     reference_peak=tracer.phase_peaks["reference"], anchor_peak=tracer.phase_peaks["anchor"])
