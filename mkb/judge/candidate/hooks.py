"""Hooks in the candidate process: learn what the DSL runtimes built and ran, and knock it out.

Installed by child.py before the candidate is imported; standard library and torch only. When
`cutlass.cute` or `tvm` is imported, their compile entry points are wrapped so that every module
the DSL builds reports its kernel symbols, and every call of a DSL-compiled callable goes through
`Tracker.dsl_call`. There, three modes serve the DSL-use check:

- normal: count the call;
- observe: also learn which tensor arguments the call wrote (compare before/after);
- knockout: skip the call and poison the tensors it wrote in the observed run, so that a
  returned tensor that depends on the DSL kernel must change.

Forbidden runtime features are watched by guards.py through the same import watcher.
Everything here runs in the untrusted process: it is evidence, checked against what the trusted
side can see (outputs, timings), never the only line of defence.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import re
import sys
from collections import defaultdict
from typing import Any, Callable

import torch

PTX_ENTRY_RE = re.compile(r"\.entry\s+(\w+)\s*\(")
KERNEL_RE = re.compile(r"__global__\s+(?:void\s+)?(?:__launch_bounds__\([^)]*\)\s*)?(?:void\s+)?(\w+)\s*\(")


class Tracker:
    """What the DSL runtimes did in this process, and the knock-out switch."""

    def __init__(self) -> None:
        self.mode = "normal"
        self.in_solve = False
        self.depth = 0
        self.compiling = 0
        self.ordinal = 0
        self.solve_calls: dict[str, int] = defaultdict(int)
        self.written: dict[int, list] = {}
        self.built: dict[str, set[str]] = defaultdict(set)
        self.called: dict[str, set[str]] = defaultdict(set)
        self.findings: list[str] = []

    def begin_solve(self, mode: str) -> None:
        self.mode, self.in_solve, self.ordinal = mode, True, 0
        self.solve_calls = defaultdict(int)

    def end_solve(self) -> dict[str, int]:
        self.in_solve = False
        return dict(self.solve_calls)

    def finding(self, text: str) -> None:
        if text not in self.findings:
            self.findings.append(text)

    def compile_scope(self, fn: Callable, *args, **kwargs):
        self.compiling += 1
        try:
            return fn(*args, **kwargs)
        finally:
            self.compiling -= 1

    def dsl_call(self, dsl: str, fn: Callable, args: tuple, kwargs: dict, symbols=()) -> Any:
        """Run (or knock out) one call of a DSL-compiled callable."""
        if self.depth or self.compiling:
            return fn(*args, **kwargs)
        self.called[dsl].update(symbols)
        if not self.in_solve:
            return self._run(fn, args, kwargs)
        self.solve_calls[dsl] += 1
        ordinal, self.ordinal = self.ordinal, self.ordinal + 1
        tensors = _tensor_args(args, kwargs)
        if self.mode == "knockout":
            for key in self.written.get(ordinal, ()):
                if key in tensors:
                    _poison(tensors[key])
            return None
        before = {k: t.clone() for k, t in tensors.items()} if self.mode == "observe" else None
        result = self._run(fn, args, kwargs)
        if before is not None:
            self.written[ordinal] = [k for k, t in tensors.items() if not _same(t, before[k])]
        return result

    def _run(self, fn: Callable, args: tuple, kwargs: dict) -> Any:
        self.depth += 1
        try:
            return fn(*args, **kwargs)
        finally:
            self.depth -= 1

    def report(self) -> dict:
        return {"built": {k: sorted(v) for k, v in self.built.items()},
                "called": {k: sorted(v) for k, v in self.called.items()},
                "findings": list(self.findings)}


def _tensor_args(args: tuple, kwargs: dict) -> dict:
    found = {}
    for key, value in list(enumerate(args)) + list(kwargs.items()):
        if isinstance(value, torch.Tensor):
            found[key] = value
        elif hasattr(value, "__dlpack__") and not isinstance(value, type):
            try:
                found[key] = torch.from_dlpack(value)
            except Exception:  # not every DLPack-looking object converts; those are simply not tracked
                pass
    return found


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN equals NaN)."""
    return bool(torch.equal(_bits(a), _bits(b)))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _poison(t: torch.Tensor) -> None:
    with torch.no_grad():
        if t.dtype == torch.bool:
            t.logical_not_()
        elif t.dtype.is_floating_point or t.dtype.is_complex:
            t.fill_(float("nan"))
        else:
            t.bitwise_not_()


# -- post-import patching -------------------------------------------------------------------

class _Watcher(importlib.abc.MetaPathFinder):
    """Runs a callback right after a watched module finishes importing."""

    def __init__(self, callbacks: dict[str, Callable]):
        self.callbacks, self.busy = callbacks, set()

    def find_spec(self, name, path, target=None):
        if name not in self.callbacks or name in self.busy:
            return None
        self.busy.add(name)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self.busy.discard(name)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            original, callback = spec.loader.exec_module, self.callbacks[name]

            def exec_module(module, _original=original, _callback=callback):
                _original(module)
                _callback(module)

            spec.loader.exec_module = exec_module
        return spec


def install(tracker: Tracker, extra: dict[str, Callable] | None = None) -> None:
    """Watch the DSLs (and the modules in extra); patch those already imported."""
    callbacks = {"cutlass.cute": lambda m: _patch_cute(tracker), "tvm": lambda m: _patch_tvm(tracker),
                 **(extra or {})}
    for name, callback in callbacks.items():
        if name in sys.modules:
            callback(sys.modules[name])
    sys.meta_path.insert(0, _Watcher(callbacks))


def _wrap_compile(tracker: Tracker, dsl: str, fn: Callable, symbols_of: Callable) -> Callable:
    def compile_and_record(*args, **kwargs):
        result = tracker.compile_scope(fn, *args, **kwargs)
        tracker.built[dsl].update(symbols_of(result))
        return result

    compile_and_record.__wrapped__ = fn
    return compile_and_record


def _cute_symbols(compiled) -> list[str]:
    return list(getattr(compiled, "kernel_info", None) or [])


def _patch_cute(tracker: Tracker) -> None:
    from cutlass.base_dsl.compiler import CompileCallable
    from cutlass.base_dsl.dsl import BaseDSL
    from cutlass.base_dsl.jit_executor import JitCompiledFunction

    CompileCallable._compile = _wrap_compile(tracker, "cutedsl", CompileCallable._compile,
                                             lambda r: (_patch_cute_class(tracker, type(r)), _cute_symbols(r))[1])
    original_func = BaseDSL._func

    def _func(self, body, *args, **kwargs):
        return tracker.dsl_call("cutedsl", original_func, (self, body) + args, kwargs)

    BaseDSL._func = _func
    original_run = JitCompiledFunction.run_compiled_program

    def run_compiled_program(self, exe_args):
        tracker.built["cutedsl"].update(_cute_symbols(self))
        tracker.called["cutedsl"].update(_cute_symbols(self))
        return original_run(self, exe_args)

    JitCompiledFunction.run_compiled_program = run_compiled_program
    _patch_cute_class(tracker, JitCompiledFunction)


def _patch_cute_class(tracker: Tracker, cls: type) -> None:
    for klass in cls.__mro__:
        call = klass.__dict__.get("__call__")
        if call is None or getattr(call, "_mkb_hooked", False) or klass is object:
            continue

        def __call__(self, *args, _call=call, **kwargs):
            return tracker.dsl_call("cutedsl", _call, (self,) + args, kwargs, _cute_symbols(self))

        __call__._mkb_hooked = True
        try:
            setattr(klass, "__call__", __call__)
        except TypeError:  # a C type: calls reach it only through the patched Python subclasses
            pass


def _tvm_symbols(module) -> list[str]:
    """Kernel symbols of the device modules under a TVM runtime module (or Executable)."""
    module = getattr(module, "mod", module)
    found, stack, seen = [], [module], set()
    while stack:
        mod = stack.pop()
        if id(mod) in seen:
            continue
        seen.add(id(mod))
        if getattr(mod, "kind", "") in ("cuda", "ptx", "cubin"):
            for fmt in ("", "cu", "ptx"):
                try:
                    source = mod.inspect_source(fmt) if fmt else mod.inspect_source()
                except Exception:  # a binary-only module carries no source in this format
                    continue
                found += KERNEL_RE.findall(source) + PTX_ENTRY_RE.findall(source)
        stack.extend(getattr(mod, "imports", ()) or ())
    return found


class _TvmFunction:
    """A TVM function whose calls go through the tracker."""

    def __init__(self, tracker: Tracker, fn, symbols: list[str]):
        self._tracker, self._fn, self._symbols = tracker, fn, symbols

    def __call__(self, *args, **kwargs):
        return self._tracker.dsl_call("tirx", self._fn, args, kwargs, self._symbols)

    def __getattr__(self, name):
        return getattr(self._fn, name)


def _patch_tvm(tracker: Tracker) -> None:
    import tvm

    for owner, name in ((tvm, "compile"), (tvm, "build"), (getattr(tvm, "tirx", None), "build")):
        if owner is not None and callable(getattr(owner, name, None)):
            setattr(owner, name, _wrap_compile(tracker, "tirx", getattr(owner, name), _tvm_symbols))
    original_load = tvm.runtime.load_module

    def load_module(*args, **kwargs):
        module = original_load(*args, **kwargs)
        tracker.built["tirx"].update(_tvm_symbols(module))
        return module

    tvm.runtime.load_module = load_module
    Module = tvm.runtime.Module
    original_get = Module.get_function

    def get_function(self, name, *args, **kwargs):
        fn = original_get(self, name, *args, **kwargs)
        return fn if fn is None else _TvmFunction(tracker, fn, _tvm_symbols(self))

    Module.get_function = get_function
