"""Guards in the candidate process: patched entry points, output descriptions, aliasing, mutation.

Standard library and torch only (the candidate process loads it by path). The descriptions
computed here are checked again on the trusted side; the integrity check catches the common
hacks (replacing a timer, synchronize or the profiler) that would otherwise go unseen.
"""

from __future__ import annotations

import builtins
import sys
import time
import types
from typing import Any, Callable

import torch

WATCHED = (
    "time.perf_counter", "time.perf_counter_ns", "time.time", "time.time_ns", "time.monotonic",
    "time.monotonic_ns", "time.process_time", "time.sleep",
    "torch.cuda.synchronize", "torch._C._cuda_synchronize", "torch.cuda.Event", "torch.cuda.Event.record",
    "torch.cuda.Event.elapsed_time",
    "torch.cuda.Event.synchronize", "torch.cuda.Event.query", "torch.cuda.Event.wait",
    "torch.cuda.Stream", "torch.cuda.Stream.wait_event", "torch.cuda.Stream.synchronize",
    "torch.cuda.current_stream", "torch.cuda.default_stream", "torch.cuda.stream", "torch.cuda.set_stream",
    "torch.cuda.is_available", "torch.profiler.profile", "torch.autograd.profiler.profile",
    "torch.Tensor.copy_", "torch.Tensor.clone", "torch.Tensor.contiguous", "torch.Tensor.to",
    "torch.Tensor.cpu", "torch.Tensor.view", "torch.Tensor.reshape", "torch.Tensor.__eq__",
    "torch.equal", "torch.allclose", "torch.isfinite", "torch.from_file",
    "torch.from_dlpack", "torch.empty", "torch.UntypedStorage._new_shared_cuda",
    "builtins.print", "builtins.open", "builtins.__import__", "sys.exit",
)
"""Entry points the judge relies on, or that timing hacks replace."""
FORBIDDEN_MODULES = ("cupy", "numba", "pycuda", "jax", "tensorflow", "mojo", "tilelang", "warp")
"""Other GPU languages: importing one at all is a policy violation."""


def _resolve(dotted: str) -> Any:
    head, *rest = dotted.split(".")
    obj = {"time": time, "torch": torch, "builtins": builtins, "sys": sys}[head]
    for part in rest:
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


class Integrity:
    """Identities of watched entry points and of the judge's own functions, taken before the candidate."""

    def __init__(self, own_modules: list[types.ModuleType]):
        self.snapshot = {name: _resolve(name) for name in WATCHED}
        for module in own_modules:
            for name, value in list(vars(module).items()):
                if callable(value):
                    self.snapshot[f"{module.__name__}.{name}"] = value
                if isinstance(value, type):
                    for attr, member in list(vars(value).items()):
                        self.snapshot[f"{module.__name__}.{name}.{attr}"] = member
        self._modules = {m.__name__: m for m in own_modules}

    def _current(self, dotted: str) -> Any:
        for module_name, module in self._modules.items():
            if dotted.startswith(module_name + "."):
                parts = dotted[len(module_name) + 1:].split(".")
                obj = vars(module).get(parts[0])
                return vars(obj).get(parts[1]) if len(parts) > 1 and isinstance(obj, type) else obj
        return _resolve(dotted)

    def patched(self) -> list[str]:
        """Watched names whose object changed since the snapshot."""
        return [name for name, value in self.snapshot.items() if self._current(name) is not value]


def describe(obj: Any) -> dict:
    """The structure of a solve() result: containers, and type/shape/dtype/device of each leaf."""
    if isinstance(obj, (list, tuple)):
        return {"k": type(obj).__name__ if type(obj) in (list, tuple) else "other",
                "type": f"{type(obj).__module__}.{type(obj).__qualname__}",
                "v": [describe(o) for o in obj]}
    if isinstance(obj, torch.Tensor):
        leaf = {"k": "tensor", "type": f"{type(obj).__module__}.{type(obj).__qualname__}",
                "plain": type(obj) is torch.Tensor}
        try:
            leaf.update(shape=list(obj.shape), dtype=str(obj.dtype).removeprefix("torch."),
                        device=obj.device.type)
        except Exception as exc:  # a lazy or broken tensor subclass may not even report its shape
            leaf["error"] = f"{type(exc).__name__}: {exc}"[:300]
        return leaf
    return {"k": "value", "type": f"{type(obj).__module__}.{type(obj).__qualname__}"}


def tensor_leaves(obj: Any, path: str = "out") -> list[tuple[str, torch.Tensor]]:
    if isinstance(obj, (list, tuple)):
        return [pair for i, o in enumerate(obj) for pair in tensor_leaves(o, f"{path}[{i}]")]
    return [(path, obj)] if isinstance(obj, torch.Tensor) else []


def _span(t: torch.Tensor) -> tuple[str, int, int]:
    storage = t.untyped_storage()
    return t.device.type, storage.data_ptr(), storage.data_ptr() + storage.nbytes()


def aliasing(out: Any, inputs: Any) -> list[str]:
    """Output paths whose memory overlaps an input's storage (a view of, or the same tensor as, an input)."""
    spans = [_span(t) for _, t in tensor_leaves(inputs, "in") if t.numel()]
    found = []
    for path, t in tensor_leaves(out):
        if type(t) is not torch.Tensor or not t.numel():
            continue
        device, lo, hi = _span(t)
        if any(d == device and lo < h and l < hi for d, l, h in spans):
            found.append(path)
    return found


def snapshot(inputs: Any) -> list[tuple[str, torch.Tensor]]:
    return [(path, t.detach().clone()) for path, t in tensor_leaves(inputs, "in")]


def mutated(inputs: Any, before: list[tuple[str, torch.Tensor]]) -> list[str]:
    """Input paths whose bits changed during solve()."""
    now = dict(tensor_leaves(inputs, "in"))
    return [path for path, old in before if not _bitwise_equal(now[path], old)]


def _bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    bits = lambda t: t.detach().contiguous().reshape(-1).view(torch.uint8)  # noqa: E731
    return a.shape == b.shape and bool(torch.equal(bits(a), bits(b)))


def copy_into(slots: Any, out: Any) -> bool:
    """Copy each output tensor into its slot when the structure matches exactly; False otherwise."""
    pairs_out, pairs_slot = tensor_leaves(out), tensor_leaves(slots)
    if len(pairs_out) != len(pairs_slot) or describe_shape(out) != describe_shape(slots):
        return False
    for (_, o), (_, s) in zip(pairs_out, pairs_slot):
        if type(o) is not torch.Tensor or o.shape != s.shape or o.dtype != s.dtype:
            return False
    with torch.no_grad():
        for (_, o), (_, s) in zip(pairs_out, pairs_slot):
            s.copy_(o)
    return True


def describe_shape(obj: Any) -> Any:
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, [describe_shape(o) for o in obj])
    return "tensor" if isinstance(obj, torch.Tensor) else type(obj).__name__


# -- forbidden runtime features (each use becomes a finding for the referee) -------------------

def forbidden_callbacks(tracker) -> dict[str, Callable]:
    """Import-watcher callbacks for NVRTC, Triton, C++ extensions, raw module loads, other GPU languages."""
    callbacks = {"cuda.bindings.nvrtc": lambda m: _patch_nvrtc(tracker, m),
                 "cuda.bindings.driver": lambda m: _patch_driver(tracker, m),
                 "triton": lambda m: _patch_triton(tracker),
                 "torch.utils.cpp_extension": lambda m: _patch_cpp_extension(tracker, m)}
    for name in FORBIDDEN_MODULES:
        callbacks[name] = lambda m, name=name: tracker.finding(f"imported {name} (another GPU language)")
    _patch_torch(tracker)
    return callbacks


def _patch_driver(tracker, module) -> None:
    """Loading a cubin/PTX by hand (outside a DSL's own calls) is raw CUDA."""
    for name in ("cuModuleLoadData", "cuModuleLoadDataEx", "cuModuleLoad", "cuLibraryLoadData", "cuLibraryLoadFromFile"):
        original = getattr(module, name, None)
        if original is None:
            continue

        def load(*args, _original=original, _name=name, **kwargs):
            if not (tracker.depth or tracker.compiling):
                tracker.finding(f"cuda.bindings.driver.{_name} loaded a GPU module outside a DSL call")
            return _original(*args, **kwargs)

        setattr(module, name, load)


def _patch_nvrtc(tracker, module) -> None:
    original = getattr(module, "nvrtcCompileProgram", None)
    if original is None:
        return

    def nvrtcCompileProgram(*args, **kwargs):
        if not tracker.compiling:
            tracker.finding("NVRTC compiled a program outside a DSL compile")
        return original(*args, **kwargs)

    module.nvrtcCompileProgram = nvrtcCompileProgram


def _patch_triton(tracker) -> None:
    """Triton's launches are findings; merely importing it is not (torch's own internals import it)."""
    try:
        from triton.runtime.jit import JITFunction
    except Exception:  # an unusual triton layout: the import finding stands on its own
        return
    original = JITFunction.run

    def run(self, *args, **kwargs):
        tracker.finding(f"launched the Triton kernel {getattr(self, '__name__', '?')}")
        return original(self, *args, **kwargs)

    JITFunction.run = run


def _patch_cpp_extension(tracker, module) -> None:
    for name in ("load_inline", "load"):
        original = getattr(module, name, None)
        if original is None:
            continue

        def loader(*args, _original=original, _name=name, **kwargs):
            tracker.finding(f"torch.utils.cpp_extension.{_name} built raw C++/CUDA")
            return _original(*args, **kwargs)

        setattr(module, name, loader)


def _patch_torch(tracker) -> None:
    """torch.compile, TorchScript, CUDA graphs and jiterator: forbidden by the kernel contract."""

    def forbid(owner, name: str, what: str) -> None:
        original = getattr(owner, name, None)
        if original is None:
            return

        def guarded(*args, **kwargs):
            tracker.finding(f"used {what}")
            return original(*args, **kwargs)

        guarded.__wrapped__ = original
        setattr(owner, name, guarded)

    forbid(torch, "compile", "torch.compile")
    forbid(torch.jit, "script", "torch.jit.script")
    forbid(torch.jit, "trace", "torch.jit.trace")
    graph_cls = getattr(torch.cuda, "CUDAGraph", None)
    if graph_cls is not None:
        forbid(graph_cls, "replay", "CUDA graphs")
        forbid(graph_cls, "capture_begin", "CUDA graphs")
    jiterator = getattr(torch.cuda, "jiterator", None)
    if jiterator is not None:
        forbid(jiterator, "_create_jit_fn", "torch.cuda.jiterator (NVRTC)")
