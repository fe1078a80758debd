"""Hooks in the candidate process: the import watcher and the DSL runtimes' patched entry points.

install() runs in child.py before kernel.py is imported (standard library and torch only). It puts a
watcher first on sys.meta_path; when `cutlass.cute` or `tvm` (or a module guards.py watches) finishes
importing, the watcher patches it. Compile and load entry points report the kernel symbols they built
("built" evidence, streamed to the referee at once) and register what they returned as genuine; call
entry points hand every call to the sealed core (knock.py), which counts, observes or knocks out the
calls of genuine callables and runs anything else uncounted.

The patched functions are trampolines: each holds the entry points in a default argument and calls one
of their methods by a fixed name. The entry points (make_entries) are closures that look up no global
name and keep the original functions themselves, so what a trampoline calls, and what is registered
as genuine, never comes from an argument a caller could pass; the seal refuses the candidate the
defaults that would reveal them. The watcher keeps its callbacks in defaults too.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import re
import sys
from typing import Callable

PTX_ENTRY_RE = re.compile(r"\.entry\s+(\w+)\s*\(")
KERNEL_RE = re.compile(r"__global__\s+(?:void\s+)?(?:__launch_bounds__\([^)]*\)\s*)?(?:void\s+)?(\w+)\s*\(")


def install(core, extra: dict[str, Callable] | None = None, check: Callable[[object, list], None] | None = None,
            report: Callable[[str], None] = lambda text: None) -> tuple[importlib.abc.MetaPathFinder, Callable]:
    """Watch the DSLs (and the modules in extra); patch those already imported. Returns the watcher and unwatched().

    check(module, symbols) vets every module a TVM build or load returns before it is registered (escape.py).
    unwatched() (see make_ledger) patches, reports and names the watched modules loaded around the watcher.
    """
    entries = make_entries(core, check or (lambda module, symbols: None))
    callbacks = {"cutlass.cute": lambda m, _e=entries: _e["patch_cute"](),
                 "tvm": lambda m, _e=entries: _e["patch_tvm"](), **(extra or {})}
    callbacks, unwatched = make_ledger(callbacks, report)
    for name, callback in callbacks.items():
        if name in sys.modules:
            callback(sys.modules[name])
    watcher = make_watcher(callbacks)
    sys.meta_path.insert(0, watcher)
    return watcher, unwatched


def make_ledger(callbacks: dict[str, Callable], report: Callable[[str], None]) -> tuple[dict[str, Callable], Callable]:
    """The callbacks, each noting the module object it patched, and unwatched(): the watched modules now loaded that
    no callback patched (kernel.py put a finder of its own first on sys.meta_path, say), each reported, then
    patched. A finder is not a wall: this check, in every fingerprint, is what keeps one from mattering."""
    patched: set = set()
    keep: list = []
    modules, id_, sorted_, list_ = sys.modules, id, sorted, list
    noted = {}
    for name, callback in callbacks.items():
        def note(module, _callback=callback, _patched=patched, _keep=keep, _id=id_):
            _patched.add(_id(module))
            _keep.append(module)  # ids stay unique while the module is kept
            _callback(module)

        noted[name] = note

    def unwatched() -> list:
        found = []
        for name, note in list_(noted.items()):
            module = modules.get(name)
            if module is not None and id_(module) not in patched:
                report("kernel.py loaded " + name + " around the judge's import hooks (a finder or loader of its own)")
                found.append(name)
                note(module)
        return sorted_(found)

    return noted, unwatched


def make_watcher(callbacks: dict[str, Callable]) -> importlib.abc.MetaPathFinder:
    """A finder that runs callbacks[name](module) right after a watched module finishes importing."""

    class Watcher(importlib.abc.MetaPathFinder):
        __slots__ = ()

        def find_spec(self, name, path, target=None, _callbacks=callbacks, _busy=set(),
                      _find=importlib.util.find_spec, _hasattr=hasattr):
            if name not in _callbacks or name in _busy:
                return None
            _busy.add(name)
            try:
                spec = _find(name)
            finally:
                _busy.discard(name)
            if spec is not None and spec.loader is not None and _hasattr(spec.loader, "exec_module"):
                def exec_module(module, _original=spec.loader.exec_module, _callback=_callbacks[name]):
                    _original(module)
                    _callback(module)

                spec.loader.exec_module = exec_module
            return spec

    return Watcher()


def cute_symbols(compiled) -> list[str]:
    """The kernel symbols of a CuTe DSL compiled function."""
    return [str(s) for s in (getattr(compiled, "kernel_info", None) or [])]


def tvm_symbols(module) -> list[str]:
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
    return sorted(set(found))


def make_entries(core: dict, check: Callable[[object, list], None]) -> dict:
    """The entry points over core (a dict of closures, as core is): built-in containers only, since a candidate
    can replace the attributes of any class it reaches; no global name is looked up inside (a test checks)."""
    modules, symbols_of_cute, symbols_of_tvm = sys.modules, cute_symbols, tvm_symbols
    type_, getattr_, setattr_, str_, sorted_, object_ = type, getattr, setattr, str, sorted, object
    TypeError_, set_attr, property_ = TypeError, object.__setattr__, property
    add_sizer = core.get("add_sizer") or (lambda klass, shape_get, element_get, stride_get=None: None)
    originals: dict = {}
    """What the patches replaced, by name, and each patched class's own __call__ (by class)."""
    dsls: list = []
    entries: dict = {}
    dsl_call, register, genuine, built, compile_scope = (core["dsl_call"], core["register"], core["genuine"],
                                                         core["built"], core["compile_scope"])

    def patch_call(klass) -> None:
        call = klass.__dict__.get("__call__")
        if call is None or klass is object_ or klass in originals:
            return
        try:
            setattr_(klass, "__call__", call_trampoline)
        except TypeError_:  # a C type: calls reach it only through the patched Python subclasses
            return
        originals[klass] = call

    def original_call(obj):
        for klass in type_(obj).__mro__:
            if klass in originals:
                return originals[klass]
        return None

    def call(args: tuple, kwargs: dict):
        """A call of a patched class's instance (args[0]): counted when the DSL built it here."""
        fallback = original_call(args[0])
        if fallback is None:
            raise TypeError_("not a callable the DSL runtime built")
        return dsl_call(args[0], fallback, args, kwargs)

    def cute_compile(args: tuple, kwargs: dict):
        result = compile_scope(originals["cute.compile"], args, kwargs)
        symbols = symbols_of_cute(result)
        for klass in type_(result).__mro__:
            patch_call(klass)
        found = original_call(result)
        if found is not None:
            register(result, "cutedsl", found, "cutedsl:" + ",".join(sorted_(symbols)), symbols)
        built("cutedsl", symbols)
        return result

    def cute_jit(args: tuple, kwargs: dict):
        dsl = args[0]
        if not genuine(dsl):
            for klass in dsls:  # the DSL's own singleton (compared by identity, never by __eq__)
                if type_(dsl) is klass:
                    register(dsl, "cutedsl", originals["cute.jit"], "cutedsl:jit", [])
        return dsl_call(dsl, originals["cute.jit"], args, kwargs)

    def cute_run(args: tuple, kwargs: dict):
        built("cutedsl", symbols_of_cute(args[0]))
        return originals["cute.run"](*args, **kwargs)

    def tvm_register(result):
        symbols = symbols_of_tvm(result)
        check(result, symbols)
        register(result, "tirx", None, "tirx:module", symbols)
        inner = getattr_(result, "mod", None)
        if inner is not None:
            register(inner, "tirx", None, "tirx:module", symbols)
        built("tirx", symbols)
        return result

    def tvm_compile(args: tuple, kwargs: dict):
        return tvm_register(compile_scope(originals["tvm.compile"], args, kwargs))

    def tvm_build(args: tuple, kwargs: dict):
        return tvm_register(compile_scope(originals["tvm.build"], args, kwargs))

    def tirx_build(args: tuple, kwargs: dict):
        return tvm_register(compile_scope(originals["tirx.build"], args, kwargs))

    def tvm_load(args: tuple, kwargs: dict):
        return tvm_register(originals["tvm.load_module"](*args, **kwargs))

    def tvm_get_function(args: tuple, kwargs: dict):
        fn = originals["tvm.get_function"](*args, **kwargs)
        if fn is None or not genuine(args[0]):
            return fn
        wrapper = TvmFunction()
        set_attr(wrapper, "_fn", fn)
        symbols = symbols_of_tvm(args[0])
        register(wrapper, "tirx", fn, "tirx:" + str_(args[1]) + ":" + ",".join(symbols), symbols)
        return wrapper

    def tvm_call(args: tuple, kwargs: dict):
        return dsl_call(args[0], refuse, args[1:], kwargs)

    def refuse(*args, **kwargs):
        raise TypeError_("this TVM function wrapper was not made by the DSL runtime")

    def patch_cute() -> None:
        compiler, dsl, executor = (modules["cutlass.base_dsl.compiler"], modules["cutlass.base_dsl.dsl"],
                                   modules["cutlass.base_dsl.jit_executor"])
        originals["cute.compile"] = compiler.CompileCallable._compile
        setattr_(compiler.CompileCallable, "_compile", cute_compile_trampoline)
        originals["cute.jit"] = dsl.BaseDSL._func
        setattr_(dsl.BaseDSL, "_func", cute_jit_trampoline)
        originals["cute.run"] = executor.JitCompiledFunction.run_compiled_program
        setattr_(executor.JitCompiledFunction, "run_compiled_program", cute_run_trampoline)
        patch_call(executor.JitCompiledFunction)
        wrapper = getattr_(modules.get("cutlass.cute.runtime"), "_Tensor", None)  # CuTe DSL's runtime tensor
        shape, element, stride = (getattr_(wrapper, "__dict__", {}).get(name) for name in ("shape", "element_type",
                                                                                           "stride"))
        if type_(shape) is property_ and type_(element) is property_:  # sized by its own getters, taken now
            add_sizer(wrapper, shape.fget, element.fget, stride.fget if type_(stride) is property_ else None)
        found = modules.get("cutlass.cutlass_dsl")
        for name in ("CuTeDSL", "CutlassBaseDSL", "CuteExperimentalDSL"):
            klass = getattr_(found, name, None)
            if klass is not None:
                dsls.append(klass)

    def patch_tvm() -> None:
        tvm = modules["tvm"]
        for owner, name, key, trampoline in ((tvm, "compile", "tvm.compile", tvm_compile_trampoline),
                                             (tvm, "build", "tvm.build", tvm_build_trampoline),
                                             (getattr_(tvm, "tirx", None), "build", "tirx.build",
                                              tirx_build_trampoline)):
            if owner is not None and getattr_(owner, name, None) is not None:
                originals[key] = getattr_(owner, name)
                setattr_(owner, name, trampoline)
        originals["tvm.load_module"] = tvm.runtime.load_module
        setattr_(tvm.runtime, "load_module", tvm_load_trampoline)
        originals["tvm.get_function"] = tvm.runtime.Module.get_function
        setattr_(tvm.runtime.Module, "get_function", tvm_get_function_trampoline)

    entries.update(patch_cute=patch_cute, patch_tvm=patch_tvm, cute_compile=cute_compile, cute_jit=cute_jit,
                   cute_run=cute_run, call=call, tvm_compile=tvm_compile, tvm_build=tvm_build, tirx_build=tirx_build,
                   tvm_load=tvm_load, tvm_get_function=tvm_get_function, tvm_call=tvm_call)

    def call_trampoline(self, *args, _e=entries, **kwargs):
        return _e["call"]((self,) + args, kwargs)

    def cute_compile_trampoline(*args, _e=entries, **kwargs):
        return _e["cute_compile"](args, kwargs)

    def cute_jit_trampoline(*args, _e=entries, **kwargs):
        return _e["cute_jit"](args, kwargs)

    def cute_run_trampoline(*args, _e=entries, **kwargs):
        return _e["cute_run"](args, kwargs)

    def tvm_compile_trampoline(*args, _e=entries, **kwargs):
        return _e["tvm_compile"](args, kwargs)

    def tvm_build_trampoline(*args, _e=entries, **kwargs):
        return _e["tvm_build"](args, kwargs)

    def tirx_build_trampoline(*args, _e=entries, **kwargs):
        return _e["tirx_build"](args, kwargs)

    def tvm_load_trampoline(*args, _e=entries, **kwargs):
        return _e["tvm_load"](args, kwargs)

    def tvm_get_function_trampoline(*args, _e=entries, **kwargs):
        return _e["tvm_get_function"](args, kwargs)

    class TvmFunction:
        """A genuine TVM function: its calls go through the core."""

        __slots__ = ("_fn",)

        def __call__(self, *args, _e=entries, **kwargs):
            return _e["tvm_call"]((self,) + args, kwargs)

        def __getattr__(self, name, _get=object_.__getattribute__, _getattr=getattr_):
            return _getattr(_get(self, "_fn"), name)

    return entries
