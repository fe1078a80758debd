"""Guards in the candidate process: entry-point fingerprints, output descriptions, aliasing, mutation.

Standard library and torch only (the candidate process loads it by path). The descriptions computed
here are checked again on the trusted side. The fingerprint of the entry points the judge relies on
(timers, synchronisation, the profiler, the functions the harness and the knock-out call, the judge's
own modules and import hooks) is streamed to the referee, which keeps the first one, taken before
kernel.py is imported, as the baseline: a candidate cannot re-baseline what it cannot reach.
"""

from __future__ import annotations

import _thread
import builtins
import json
import os
import struct
import sys
import threading
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
    "torch.cuda.is_available", "torch.profiler.profile", "torch.profiler.record_function",
    "torch.autograd.profiler.profile", "torch.autograd.profiler.record_function", "torch.autograd._profiler_enabled",
    "torch.Tensor.copy_", "torch.Tensor.clone", "torch.Tensor.contiguous", "torch.Tensor.to",
    "torch.Tensor.cpu", "torch.Tensor.view", "torch.Tensor.reshape", "torch.Tensor.__eq__",
    "torch.Tensor.fill_", "torch.Tensor.zero_", "torch.Tensor.bitwise_not_", "torch.Tensor.logical_not_",
    "torch.Tensor.normal_", "torch.Tensor.uniform_", "torch.Tensor.random_", "torch.Tensor.clamp_",
    "torch.Tensor.__setitem__", "torch.Tensor.item", "torch.Tensor.data_ptr", "torch.Tensor.untyped_storage",
    "torch.equal", "torch.allclose", "torch.isclose", "torch.isfinite", "torch.isnan", "torch.nan_to_num",
    "torch.where", "torch.from_file", "torch.from_dlpack", "torch.empty", "torch.no_grad", "torch.Generator",
    "torch.UntypedStorage._new_shared_cuda", "torch.testing.assert_close",
    "torch._C._len_torch_dispatch_stack", "torch._C._len_torch_function_stack",
    "builtins.print", "builtins.open", "builtins.__import__", "builtins.isinstance", "builtins.len",
    "builtins.getattr", "builtins.type", "sys.exit", "sys._getframe",
    "os.read", "os.write", "os._exit", "json.dumps", "json.loads", "struct.pack", "struct.unpack",
    "_thread.start_new_thread", "_thread.start_joinable_thread", "threading._start_new_thread",
    "threading._start_joinable_thread",
)
"""Entry points the judge relies on (timing, the comparison's inputs, the knock-out), or that timing hacks replace."""
FORBIDDEN_MODULES = ("cupy", "numba", "pycuda", "jax", "tensorflow", "mojo", "tilelang", "warp")
"""Other GPU languages: importing one at all is a policy violation."""


def make_fingerprint(own: list[types.ModuleType], hooks: list[object], probe: Callable[[], str],
                     unwatched: Callable[[], list] = lambda: []) -> Callable[[], dict[str, str]]:
    """A function naming the object behind every watched entry point, every callable of the judge's own
    modules, whether each of the judge's import hooks is still on sys.meta_path, the dispatcher's state
    (probe, escape.make_dispatcher_probe) and the watched modules loaded around those hooks (unwatched, hooks.make_ledger).

    It is a closure over what it needs, taken now (before kernel.py is imported), and looks up no global
    name, so a candidate that replaces module attributes cannot make it report the old objects.
    """
    roots = {"time": time, "torch": torch, "builtins": builtins, "sys": sys, "os": os, "json": json,
             "struct": struct, "_thread": _thread, "threading": threading}
    dicts = []
    for module in own:
        dicts.append((module.__name__, vars(module)))
    meta_path, getattr_, id_, str_, type_, callable_ = sys.meta_path, getattr, id, str, type, callable
    list_, enumerate_, watched = list, enumerate, WATCHED
    dispatch_depth, function_depth = torch._C._len_torch_dispatch_stack, torch._C._len_torch_function_stack
    module_type, hash_ = types.ModuleType, hash

    def resolve(dotted: str):
        head, *rest = dotted.split(".")
        obj = roots[head]
        for part in rest:
            obj = getattr_(obj, part, None)
            if obj is None:
                return None
        return obj

    def fingerprint() -> dict[str, str]:
        found = {}
        for name in watched:
            found[name] = str_(id_(resolve(name)))
        for module_name, names in dicts:
            for name, value in list_(names.items()):
                if callable_(value) or type_(value) is module_type:
                    found[module_name + "." + name] = str_(id_(value))
        for i, hook in enumerate_(hooks):
            present = False
            for entry in list_(meta_path):
                present = present or entry is hook
            found["sys.meta_path[judge hook " + str_(i) + "]"] = str_(present)
        found["torch dispatch/function modes"] = str_(dispatch_depth() + function_depth())
        found["torch dispatcher (Python kernels on the judge's operators)"] = str_(hash_(probe()))
        found["watched modules loaded around the judge's import hooks"] = str_(unwatched())
        return found

    return fingerprint


def _children(obj: Any) -> list | None:
    """The items of a plain list or tuple, else None.

    Only the exact built-in types are walked: a subclass's __iter__, __len__ or __getitem__ (or a metaclass's
    __name__) is the candidate's code, and the harness walks outputs *after* a timed call's window has closed
    (copy_into): a container whose iteration did the work would have done it outside every measured window.
    """
    kind = type(obj)
    return list.copy(obj) if kind is list else [*tuple.__iter__(obj)] if kind is tuple else None


def describe(obj: Any) -> dict:
    """The structure of a solve() result: containers, and type/shape/dtype/device of each leaf."""
    if (items := _children(obj)) is not None:
        return {"k": type(obj).__name__, "type": f"builtins.{type(obj).__name__}", "v": [describe(o) for o in items]}
    if isinstance(obj, (list, tuple)):  # a subclass: named, never walked
        return {"k": "other", "type": _type_name(obj), "v": []}
    if isinstance(obj, torch.Tensor):
        leaf = {"k": "tensor", "type": _type_name(obj), "plain": type(obj) is torch.Tensor}
        try:
            leaf.update(shape=list(obj.shape), dtype=str(obj.dtype).removeprefix("torch."),
                        device=obj.device.type)
        except Exception as exc:  # a lazy or broken tensor subclass may not even report its shape
            leaf["error"] = f"{type(exc).__name__}: {exc}"[:300]
        return leaf
    return {"k": "value", "type": _type_name(obj)}


def _type_name(obj: Any) -> str:
    """module.qualname of obj's type, read from the type's own dict (a metaclass property would run code)."""
    kind = type(obj)
    qualname, module = type.__dict__["__qualname__"].__get__(kind), type.__dict__["__module__"].__get__(kind)
    return f"{module}.{qualname}" if type(module) is str and type(qualname) is str else "?"


def tensor_leaves(obj: Any, path: str = "out") -> list[tuple[str, torch.Tensor]]:
    if (items := _children(obj)) is not None:
        return [pair for i, o in enumerate(items) for pair in tensor_leaves(o, f"{path}[{i}]")]
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


SNAPSHOT_LIMIT_BYTES = 1 << 30
"""Inputs larger than this together are not copied for mutated(): the referee compares the same shared memory
with its private inputs bit for bit after every draw (the check that decides), and a second copy here would
take that much GPU memory from the kernel during its call."""


def snapshot(inputs: Any) -> list[tuple[str, torch.Tensor]]:
    leaves = tensor_leaves(inputs, "in")
    if sum(t.numel() * t.element_size() for _, t in leaves) > SNAPSHOT_LIMIT_BYTES:
        return []
    return [(path, t.detach().clone()) for path, t in leaves]


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
    if (items := _children(obj)) is not None:
        return (type(obj).__name__, [describe_shape(o) for o in items])
    return "tensor" if type(obj) is torch.Tensor else "other"


# -- forbidden runtime features (each use becomes a finding for the referee) -------------------

def forbidden_callbacks(core, finding: Callable[[str], None]) -> dict[str, Callable]:
    """Import-watcher callbacks for NVRTC, Triton, C++ extensions, raw module loads and other GPU languages. The
    wrappers hold the core and finding() in default arguments (see hooks.py). Operator overrides: escape.py."""
    callbacks = {"cuda.bindings.nvrtc": lambda m, _c=core, _f=finding: _patch_nvrtc(_c, _f, m),
                 "cuda.bindings.driver": lambda m, _c=core, _f=finding: _patch_driver(_c, _f, m),
                 "triton": lambda m, _f=finding: _patch_triton(_f),
                 "torch.utils.cpp_extension": lambda m, _f=finding: _patch_cpp_extension(_f, m)}
    for name in FORBIDDEN_MODULES:
        callbacks[name] = lambda m, _f=finding, _n=name: _f(f"imported {_n} (another GPU language)")
    _patch_torch(finding)
    return callbacks


def _patch_driver(core, finding, module) -> None:
    """Loading a cubin/PTX by hand (outside a DSL's own calls) is raw CUDA."""
    for name in ("cuModuleLoadData", "cuModuleLoadDataEx", "cuModuleLoad", "cuLibraryLoadData", "cuLibraryLoadFromFile"):
        original = getattr(module, name, None)
        if original is None:
            continue

        def load(*args, _original=original, _name=name, _core=core, _finding=finding, **kwargs):
            if not _core["inside"]():
                _finding(f"cuda.bindings.driver.{_name} loaded a GPU module outside a DSL call")
            return _original(*args, **kwargs)

        setattr(module, name, load)


def _patch_nvrtc(core, finding, module) -> None:
    original = getattr(module, "nvrtcCompileProgram", None)
    if original is None:
        return

    def nvrtcCompileProgram(*args, _original=original, _core=core, _finding=finding, **kwargs):
        if not _core["inside"]():
            _finding("NVRTC compiled a program outside a DSL compile")
        return _original(*args, **kwargs)

    module.nvrtcCompileProgram = nvrtcCompileProgram


def _patch_triton(finding) -> None:
    """Triton's launches are findings; merely importing it is not (torch's own internals import it)."""
    try:
        from triton.runtime.jit import JITFunction
    except Exception:  # an unusual triton layout: the import finding stands on its own
        return

    def run(self, *args, _original=JITFunction.run, _finding=finding, **kwargs):
        _finding(f"launched the Triton kernel {getattr(self, '__name__', '?')}")
        return _original(self, *args, **kwargs)

    JITFunction.run = run


def _patch_cpp_extension(finding, module) -> None:
    for name in ("load_inline", "load"):
        original = getattr(module, name, None)
        if original is None:
            continue

        def loader(*args, _original=original, _name=name, _finding=finding, **kwargs):
            _finding(f"torch.utils.cpp_extension.{_name} built raw C++/CUDA")
            return _original(*args, **kwargs)

        setattr(module, name, loader)


def _patch_torch(finding) -> None:
    """torch.compile, TorchScript, CUDA graphs and jiterator: forbidden by the kernel contract."""

    def forbid(owner, name: str, what: str) -> None:
        original = getattr(owner, name, None)
        if original is None:
            return

        def guarded(*args, _original=original, _what=what, _finding=finding, **kwargs):
            _finding(f"used {_what}")
            return _original(*args, **kwargs)

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
