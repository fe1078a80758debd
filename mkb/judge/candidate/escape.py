"""Ways out of the seal that no audit event sees: DSL host code, Python callbacks, unaudited frame sources.

A TIRx function compiled for the host (target llvm, and the host side of every GPU build) is native code
that TVM links into the candidate process. `T.call_extern` reaches any symbol the process has loaded
(libc's open or fork, libcuda's cuModuleLoadData and cuLaunchKernel), and `T.call_packed` any function in
TVM's global registry, which kernel.py could fill with Python functions of its own. Either runs code the
DSL did not build, beyond the seal (no audit event sees native code), and inside a genuine DSL call, where
the knock-out, the share and the checks for forbidden features credit it to the DSL. Two checks close it,
both before anything a build returned can run:

- make_checker(): every host (llvm) module a TVM build returns may declare only LLVM intrinsics, the TVM
  runtime's own entry points and C math functions, and may look up by name only the device kernels of the
  same build, TVM's `__tvm_*` helpers and TVM runtime functions (`runtime.*`). Anything else is a finding,
  and the build raises PermissionError. (Every shipped TIRx solution's host code, built for sm_90a, uses
  TVMFFIErrorSetRaisedFromCStrParts, llvm.* intrinsics, its kernels, __tvm_set_device and
  runtime.cuTensorMapEncodeTiled, nothing else.)
- callbacks(): kernel.py may not register global functions. tvm_ffi's one registration entry point is
  patched when tvm_ffi.core loads; registrations made during an import, or inside the judge's DSL hooks
  (a compile), are TVM's own.

Two standard entry points hand out frames, the objects the seal exists to keep away, without raising any
audit event: a signal handler is called with the frame that was running (the harness's, whose f_back and
f_locals lead to a draw's mode, the harness's channels, everything), and gc.set_debug(DEBUG_SAVEALL) puts
every object a collection frees (frames of tracebacks among them) into gc.garbage; faulthandler and
tracemalloc print where the harness's threads are and what its lines allocated. patch_unaudited() refuses
them to kernel.py before it is imported (signal and gc are loaded with torch, so refusing their import
cannot work: an import of a loaded module raises no event).

A Python kernel registered for one of torch's operators (torch.library.impl("aten::copy_", "CPU"), which
creates its Library inside torch) runs inside the judge's own tensor operations and sees which tensor the
knock-out poisons. patch_dispatcher() refuses kernel.py every new library that is not a fresh namespace of
its own; a kernel added to a library torch already holds is caught by the dispatcher probe
(make_dispatcher_probe) that the knock-out checks before it writes and the fingerprint carries.

Standard library and torch only; loaded by path in the candidate process. The closures look up no global name
(a test disassembles them), as the hooks' do.
"""

from __future__ import annotations

import _thread
import re
import sys
import threading
from typing import Callable

import torch

DECLARE_RE = re.compile(r'^declare[^@\n]*@"?([^"(\s]+)"?\(', re.M)
"""An external function an LLVM module calls (`declare ... @name(`)."""
PACKED_RE = re.compile(r'@"?__tvm_func_handle_init\.([^"(\s]+)"?\(')
"""A function a TVM host module looks up by name at run time (T.call_packed, a kernel launch)."""
RUNTIME = ("llvm.", "TVMFFI", "TVMBackend", "__tvm")
"""Declared names that are LLVM intrinsics or the TVM runtime's own entry points."""
CONVERSIONS = re.compile(r"__(trunc|extend)[a-z]+f2|__gnu_[fh]2[fh]_ieee")
"""Compiler-runtime float conversions LLVM may call."""
_MATH = ("exp exp2 expm1 log log2 log10 log1p pow sqrt cbrt sin cos tan asin acos atan atan2 sinh cosh tanh "
         "asinh acosh atanh erf erfc fabs floor ceil round trunc fmod fma fmax fmin hypot ldexp copysign "
         "nearbyint rint lgamma tgamma").split()
MATH = frozenset(_MATH + [name + "f" for name in _MATH])
"""C math functions (double and float) a host kernel may call."""
PACKED_OK = ("__tvm", "runtime.")
"""Names a host module may look up besides its own kernels: TVM's helpers and runtime functions."""


def make_checker(finding: Callable[[str], None]) -> Callable[[object, list], None]:
    """check(module, symbols): refuse a built TVM module whose host code calls outside the DSL (see above).

    symbols: the device kernel symbols of the same build (hooks.tvm_symbols).
    """
    declare_re, packed_re, conversions = DECLARE_RE, PACKED_RE, CONVERSIONS
    runtime, math, packed_ok = RUNTIME, MATH, PACKED_OK
    getattr_, str_, set_, sorted_, id_ = getattr, str, set, sorted, id
    Exception_, PermissionError_ = Exception, PermissionError

    def host_sources(module) -> list:
        """The LLVM IR of every host module under module (None where it cannot be read)."""
        found, stack, seen = [], [getattr_(module, "mod", module)], set_()
        while stack:
            mod = stack.pop()
            if id_(mod) in seen:
                continue
            seen.add(id_(mod))
            if getattr_(mod, "kind", "") == "llvm":
                try:
                    found.append(str_(mod.inspect_source("ll")))
                except Exception_:  # an LLVM module that cannot print its IR cannot be checked
                    found.append(None)
            stack.extend(getattr_(mod, "imports", ()) or ())
        return found

    def check(module, symbols: list) -> None:
        kernels, bad = set_(symbols), set_()
        for source in host_sources(module):
            if source is None:
                bad.add("built host code whose IR cannot be read")
                continue
            for name in declare_re.findall(source):
                if not (name.startswith(runtime) or name in math or conversions.fullmatch(name)):
                    bad.add("calls the host function " + name)
            for name in packed_re.findall(source):
                if name not in kernels and not name.startswith(packed_ok):
                    bad.add("calls the global function " + name)
        if bad:
            text = ("TIRx host code " + "; ".join(sorted_(bad)[:5]) + ": code the DSL did not build (call_extern, "
                    "call_packed of a Python function) is forbidden")
            finding(text)
            raise PermissionError_(text)

    return check


def make_asker(kind: Callable[[str], str]) -> Callable[[], bool]:
    """asked(): whether kernel.py's code stands behind the caller of asked()'s caller, with nothing but
    libraries between them (an import, or the judge's own hooks, in between make it the library's doing).

    kind: seal.Roots.kind (harness, library, transparent, stdlib or candidate, by a code object's file).
    """
    getframe = sys._getframe

    def asked() -> bool:
        frame = getframe(2)
        while frame is not None:
            filename = frame.f_code.co_filename
            if filename.startswith("<frozen importlib"):
                return False
            found = kind(filename)
            if found == "harness":
                return False
            if found == "candidate":
                return True
            frame = frame.f_back
        return True  # only libraries on the stack: a thread kernel.py started

    return asked


def callbacks(finding: Callable[[str], None], asked: Callable[[], bool]) -> dict[str, Callable]:
    """Import-watcher callbacks (hooks.install's extra): refuse kernel.py registering TVM global functions."""
    return {"tvm_ffi.core": lambda module, _f=finding, _a=asked: _patch_registry(module, _f, _a)}


def _patch_registry(module, finding: Callable[[str], None], asked: Callable[[], bool]) -> None:
    original = getattr(module, "_register_global_func", None)
    if original is None:
        return

    def _register_global_func(name, function, override, *rest, _original=original, _finding=finding, _asked=asked):
        if _asked():
            text = (f"kernel.py registered the TVM global function {str(name)[:80]!r}: DSL code may not call back "
                    "into Python")
            _finding(text)
            raise PermissionError(text)
        return _original(name, function, override, *rest)

    module._register_global_func = _register_global_func


DISPATCHED = ("fill_.Scalar", "copy_", "normal_", "uniform_", "random_.from", "clamp_", "lt.Scalar", "bitwise_not_",
              "logical_not_", "clone", "equal", "empty.memory_format", "isfinite", "index.Tensor", "_to_copy", "mean",
              "std.correction", "min", "max", "_local_scalar_dense", "view.dtype", "view", "reshape", "detach",
              "contiguous", "eq.Tensor", "set_.source_Storage_storage_offset")
"""ATen operators the knock-out and the harness run on the candidate's tensors: a Python kernel registered for one
(torch.library on an existing library, say) would see which tensor the knock-out poisons."""
PYTHON_KEYS = ("PythonDispatcher", "Python", "PythonTLSSnapshot", "PreDispatch", "Functionalize",
               "FuncTorchDynamicLayerFrontMode", "FuncTorchDynamicLayerBackMode")
"""Dispatch keys that, included in the thread's local set, route every operator into Python."""


UNAUDITED = (("_signal", "signal", "a signal handler is handed the running frame"),
             ("gc", "set_debug", "DEBUG_SAVEALL keeps every freed object, frames too, in gc.garbage"),
             ("faulthandler", "dump_traceback", "it prints where every thread of the judge's code is"),
             ("faulthandler", "dump_traceback_later", "it prints where every thread of the judge's code is"),
             ("faulthandler", "register", "it prints where every thread of the judge's code is"),
             ("tracemalloc", "start", "allocation tracebacks name the judge's code behind its memory"))
"""(module, function, why): entry points that give kernel.py frames without an audit event."""


def patch_unaudited(report: Callable[[str], None], asked: Callable[[], bool]) -> None:
    """Make each UNAUDITED entry point refuse kernel.py (asked(): see make_asker) with a report and PermissionError."""
    for module_name, name, why in UNAUDITED:
        module = sys.modules.get(module_name) or __import__(module_name)
        original = getattr(module, name)

        def guarded(*args, _original=original, _what=f"{module_name.lstrip('_')}.{name}", _why=why, _report=report,
                    _asked=asked, **kwargs):
            if _asked():
                text = f"kernel.py called {_what} ({_why}): forbidden"
                _report(text)
                raise PermissionError(text)
            return _original(*args, **kwargs)

        setattr(module, name, guarded)


THREAD_STARTS = (("_thread", "start_new_thread"), ("_thread", "start_joinable_thread"),
                 ("threading", "_start_new_thread"), ("threading", "_start_joinable_thread"))
"""Where a Python thread is started (the names this Python has): threading binds _thread's at its import."""


def track_threads(asked: Callable[[], bool]) -> Callable[[], tuple[int, int]]:
    """Count the Python threads kernel.py starts (asked(): see make_asker): status() -> (started, still running).

    On CPU the DSL's share is read from the profiler, which records the operators of the thread that started it
    only: torch's work moved to a thread of the kernel's would count for nobody (tests/kernels/share_thread_torch.py).
    trace.profile_calls reads status() around each profiled call, and share.py measures no CPU share for a call that
    such a thread may have shared. Threads of the libraries (torch's, the DSLs') and the judge's are not counted.
    """
    lock, counts = _thread.allocate_lock(), [0, 0]

    def wrap(original):
        def start(function, *args, _original=original, _asked=asked, _lock=lock, _counts=counts, **kwargs):
            if not _asked():
                return _original(function, *args, **kwargs)

            def run(*a, _function=function, **k):
                try:
                    return _function(*a, **k)
                finally:
                    with _lock:
                        _counts[1] -= 1

            with _lock:
                _counts[0] += 1
                _counts[1] += 1
            try:
                return _original(run, *args, **kwargs)
            except BaseException:
                with _lock:
                    _counts[1] -= 1
                raise

        return start

    modules = {"_thread": _thread, "threading": threading}
    for module_name, name in THREAD_STARTS:
        original = getattr(modules[module_name], name, None)
        if original is not None:
            setattr(modules[module_name], name, wrap(original))

    def status() -> tuple[int, int]:
        with lock:
            return counts[0], counts[1]

    return status


def make_dispatcher_probe() -> Callable[[], str]:
    """probe(): the kernels registered for the DISPATCHED operators (torch's own dump of each) and the Python-routing
    dispatch keys the thread includes, as one string; it changes when anyone puts Python between the judge and
    those operators. A closure over what it needs, taken now; it looks up no global name."""
    dump, included, keys = torch._C._dispatch_dump, torch._C._dispatch_tls_is_dispatch_key_included, torch._C.DispatchKey
    names = []
    for name in DISPATCHED:
        try:
            dump("aten::" + name)
            names.append("aten::" + name)
        except Exception:  # not an operator of this torch: nothing to watch
            continue
    python_keys = []
    for key in PYTHON_KEYS:
        if hasattr(keys, key):
            python_keys.append(getattr(keys, key))
    join, str_ = "\n".join, str

    def probe() -> str:
        return join([dump(name) for name in names] + [str_(included(k)) for k in python_keys])

    return probe


def patch_dispatcher(report: Callable[[str], None], asked: Callable[[], bool]) -> None:
    """Refuse kernel.py (asked(): see make_asker) a torch library that could hold kernels of existing operators:
    any kind but DEF or FRAGMENT, or a namespace that already has operators (aten, prims, ...)."""
    original = torch._C._dispatch_library
    taken = frozenset(name.split("::")[0] for name in torch._C._dispatch_get_all_op_names())

    def _dispatch_library(kind, ns, *args, _original=original, _taken=taken, _report=report, _asked=asked,
                          _str=str, _PermissionError=PermissionError, **kwargs):
        own_namespace = type(kind) is _str and kind in ("DEF", "FRAGMENT") and type(ns) is _str and ns not in _taken
        if not own_namespace and _asked():
            text = ("kernel.py made a torch library that can override torch's operators "
                    f"({_str.__str__(kind) if type(kind) is _str else '?'} on "
                    f"{_str.__str__(ns) if type(ns) is _str else '?'}): forbidden")
            _report(text)
            raise _PermissionError(text)
        return _original(kind, ns, *args, **kwargs)

    torch._C._dispatch_library = _dispatch_library
