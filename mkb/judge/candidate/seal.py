"""The candidate process's seal: an audit hook that refuses the candidate's code what object walks need.

Installed by child.py before kernel.py is imported; an audit hook cannot be removed, and this one is
referenced by nothing Python can reach. For an event raised on behalf of the candidate's code it refuses
frames (sys._getframe, traceback and generator frames, f_code, __code__, __defaults__), the garbage
collector's object lists, tracing and profiling hooks, new processes and signals (fork, exec, spawn,
system, subprocess, kill), ctypes, dynamic code (compile, exec, marshal, pickle, new code and function
objects), writes to attributes of classes and functions that are not its own, more audit hooks, /proc's
view of its memory and file descriptors, and code files (.py, .pyc, .so, .pth) outside the installed
libraries. A refusal raises PermissionError where it happened and is reported to the referee at once,
so catching the exception does not hide it.

Who asks is the innermost frame outside the standard library: the candidate's files (kernel.py and any
file that is neither the judge's harness nor an installed library's) are refused; the harness and the
installed libraries (torch, the DSLs) are allowed, except library modules that act for their caller
(TRANSPARENT: they hand out frames or build native code) and code made at run time, which are skipped
like the standard library.
Two standard-library paths read frames only to return text and stay allowed: traceback's formatting of
an exception (not with capture_locals, whose text is the repr of every local of every frame) and logging's
search for its caller. Nothing the hook does runs the candidate's code
(no attribute lookups or comparisons on its objects), so no event can slip past while it decides.
"""

from __future__ import annotations

import os
import re
import site
import sys
import sysconfig
import threading
import types
from importlib.machinery import SourceFileLoader, SourcelessFileLoader
from typing import Callable

GUARDED = frozenset({
    "sys._getframe", "sys._current_frames", "sys._current_exceptions", "sys.settrace", "sys.setprofile",
    "sys.addaudithook", "gc.get_objects", "gc.get_referrers", "gc.get_referents",
    "object.__getattr__", "object.__setattr__", "object.__delattr__",
    "os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen",
    "pty.spawn", "os.kill", "os.killpg", "signal.pthread_kill",
    "compile", "exec", "marshal.loads", "marshal.load", "pickle.find_class", "code.__new__", "function.__new__",
    "open", "os.rename", "os.link", "os.symlink", "shutil.copyfile", "shutil.move", "import",
})
"""Audit events the seal looks at (and every ctypes.* event); all others pass untouched."""
PATH_EVENTS = ("open", "os.rename", "os.link", "os.symlink", "shutil.copyfile", "shutil.move")
IMPORT_WORK = ("exec", "marshal.loads", "compile")
"""What the import machinery does on its own when the candidate imports a module."""
FORBIDDEN_IMPORTS = frozenset({"ctypes", "_ctypes", "cffi", "gc", "inspect", "subprocess", "_posixsubprocess",
                               "multiprocessing", "_multiprocessing", "pty", "signal", "_signal", "runpy",
                               "faulthandler", "tracemalloc", "_testcapi", "_testinternalcapi"})
"""Modules the candidate's own code may not import at run time (the static scan names them too). An import of a
module already loaded raises no audit event (torch loads gc, inspect, signal and ctypes): what guards those is
the audit events of their use, and escape.patch_unaudited for the entry points that raise none."""
CODE_SUFFIXES = (".py", ".pyc", ".pyo", ".pyd", ".so", ".pth")
PROC_RE = re.compile(r"^/proc/(self|thread-self|\d+)/(task/\d+/)?(mem|fd|fdinfo|map_files|environ)\b")
TRANSPARENT = ("/torch/_jit_internal.py", "/torch/jit/", "/torch/_sources.py", "/torch/package/",
               "/torch/utils/_traceback.py", "/torch/fx/", "/torch/_dynamo/", "/torch/_inductor/",
               "/torch/utils/cpp_extension.py", "/torch/_logging/", "/tvm/contrib/", "/tvm_ffi/cpp/",
               "/tvm_ffi/error.py")
"""Library files that act for their caller (return frames, compile native code): their caller decides."""
READERS = {("object.__getattr__", "_walk_tb_with_full_positions"): "_extract_from_extended_frame_gen",
           ("object.__getattr__", "_extract_from_extended_frame_gen"): None,
           ("object.__getattr__", "findCaller"): None, ("object.__getattr__", "_is_internal_frame"): "findCaller",
           ("sys._getframe", "<lambda>"): "findCaller",
           ("sys._getframe", "_caller"): None, ("sys._getframe", "namedtuple"): None,
           ("sys._getframe", "_create_"): None,
           ("compile", "namedtuple"): None, ("exec", "namedtuple"): None, ("object.__setattr__", "namedtuple"): None,
           ("compile", "_create_fn"): None, ("exec", "_create_fn"): None}
"""Standard-library code that reads frames only to return text, or compiles code from a fixed template
(named <string>, so the code it makes decides nothing): (event, reader) -> the consumer it must serve
(None: any). traceback formats an exception; logging finds its caller's file and line; typing, namedtuple
and enum name the module that defines a class; namedtuple and dataclasses generate their methods."""
_MODULE_OF = {type: type.__dict__["__module__"], types.FunctionType: types.FunctionType.__dict__["__module__"]}


def make_plain() -> Callable[[object], str | None]:
    """plain(value): a str or bytes (subclasses too) as a plain str, without running any method the object
    defines; None for anything else."""
    type_, issubclass_, str_, bytes_ = type, issubclass, str, bytes
    as_str, concat, fsdecode = str.__str__, bytes.__add__, os.fsdecode

    def plain(value) -> str | None:
        if issubclass_(type_(value), str_):
            return as_str(value)
        if issubclass_(type_(value), bytes_):
            return fsdecode(concat(b"", value))
        return None

    return plain


class Roots:
    """Where code comes from: the harness, the kernel, installed libraries, the standard library.

    kind(filename) and sensitive(event, args) are closures made here (classifier), so that what they decide
    does not depend on any name kernel.py could rebind later.
    """

    def __init__(self, harness_dir: str, kernel_dir: str):
        self.harness = os.path.realpath(harness_dir) + os.sep
        self.kernel = os.path.realpath(kernel_dir) + os.sep
        paths = sysconfig.get_paths()
        libs = {paths["purelib"], paths["platlib"], *site.getsitepackages()}
        libs.update(p for p in sys.path if "site-packages" in p or "dist-packages" in p)
        self.libraries = tuple(sorted({os.path.realpath(p) + os.sep for p in libs if p}))
        std = {paths["stdlib"], paths["platstdlib"], os.path.dirname(os.__file__)}
        self.stdlib = tuple(sorted({os.path.realpath(p) + os.sep for p in std if p}))
        self.kind, self.sensitive = classifier(self.harness, self.kernel, self.libraries, self.stdlib)


def classifier(harness: str, kernel: str, libraries: tuple, stdlib: tuple) -> tuple[Callable, Callable]:
    """kind(filename): harness, library, transparent, stdlib or candidate (a code object's co_filename is always a
    str); sensitive(event, args): whether a path event touches /proc's view of the process, or a code file
    outside the known roots."""
    realpath, transparent, proc_re, suffixes, plain = os.path.realpath, TRANSPARENT, PROC_RE, CODE_SUFFIXES, make_plain()
    inside = (harness, kernel, *libraries, *stdlib)
    kinds: dict[str, str] = {}

    def classify(filename: str) -> str:
        if filename.startswith("<frozen "):
            return "stdlib"
        if not (filename.startswith("/") and filename.endswith(".py")):
            # code made at run time (<string>, a C++ frame in a TVM traceback): the candidate cannot make code
            # (compile, exec and new code objects are refused to it), so whoever called it decides
            return "transparent"
        path = realpath(filename)
        if path.startswith(harness):
            return "harness"
        if path.startswith(kernel):
            return "candidate"
        if path.startswith(libraries):
            for part in transparent:
                if part in path:
                    return "transparent"
            return "library"
        if path.startswith(stdlib):
            return "stdlib"
        return "candidate"

    def kind(filename: str) -> str:
        found = kinds.get(filename)
        if found is None:
            found = kinds[filename] = classify(filename)
        return found

    def sensitive(event: str, args: tuple) -> bool:
        paths = []
        for arg in args[:1 if event == "open" else 2]:
            path = plain(arg)
            if path is not None:
                paths.append(path)
        if event == "open" and paths and proc_re.match(paths[0]):
            return True
        for path in paths:
            if path.endswith(suffixes) and not realpath(path).startswith(inside):
                return True
        return False

    return kind, sensitive


def install(roots: Roots, report: Callable[[str], None], kernel_module: str = "kernel") -> Callable[[], bool]:
    """Add the audit hook; report(text) is told of every refusal before PermissionError is raised.

    Returns from_candidate(): whether the code that called its caller is the candidate's. The hook and its helpers
    are closures over what they use, taken now: they look up no global name (a test disassembles them), since
    kernel.py can reach this module's dictionary (through __main__) and rebind anything in it.
    """
    busy: set[int] = set()
    get_ident, getframe, kind, sensitive, plain = threading.get_ident, sys._getframe, roots.kind, roots.sensitive, \
        make_plain()
    guarded, path_events, import_work, forbidden, readers = GUARDED, PATH_EVENTS, IMPORT_WORK, FORBIDDEN_IMPORTS, READERS
    source_loader, sourceless_loader, basename, realpath = SourceFileLoader, SourcelessFileLoader, os.path.basename, \
        os.path.realpath
    function_type, type_module, function_module = types.FunctionType, _MODULE_OF[type], _MODULE_OF[types.FunctionType]
    type_, issubclass_, vars_, str_, Exception_, PermissionError_ = type, issubclass, vars, str, Exception, \
        PermissionError
    attribute_events = ("object.__getattr__", "object.__setattr__", "object.__delattr__")
    verbs = {"object.__getattr__": "read", "object.__setattr__": "set", "object.__delattr__": "deleted"}

    def origin(frame) -> tuple[str, object]:
        """The kind of the innermost frame that is neither standard library nor transparent, and that frame;
        prefixed 'import:' when the import machinery stands between it and the event."""
        importing = False
        while frame is not None:
            filename = frame.f_code.co_filename
            found = kind(filename)
            if found == "stdlib" or found == "transparent":
                importing = importing or filename.startswith("<frozen importlib")
                frame = frame.f_back
                continue
            return ("import:" if importing else "") + found, frame
        return "candidate", None  # only the standard library on the stack: a bare thread the candidate started

    def allowed_reader(event: str, frame) -> bool:
        if frame is None or kind(frame.f_code.co_filename) != "stdlib":
            return False
        key = (event, frame.f_code.co_name)
        if key not in readers:
            return False
        above = frame.f_back
        for extractor in (frame, above):  # traceback's extractor returns text, unless it captures locals
            if extractor is not None and extractor.f_code.co_name == "_extract_from_extended_frame_gen":
                wants = extractor.f_locals.get("capture_locals")
                if wants is not False and wants is not None:
                    return False
        return readers[key] is None or (above is not None and above.f_code.co_name == readers[key]
                                        and kind(above.f_code.co_filename) == "stdlib")

    def own(obj) -> bool:
        """A class or function of kernel.py (read through the type's own slot, never the object's lookup; the type
        is compared by identity, never hashed or compared with ==, which a metaclass could define)."""
        cls = type_(obj)
        if cls is function_type:
            getter = function_module
        elif cls is type_ or issubclass_(cls, type_):
            getter = type_module
        else:
            return False
        try:
            module = getter.__get__(obj)
        except Exception_:  # a class without a module
            return False
        return type_(module) is str_ and module == kernel_module

    def importer(frame) -> str:
        """The kind of the frame whose import statement (or __import__ call) the import machinery is serving."""
        while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
            frame = frame.f_back
        return "candidate" if frame is None else kind(frame.f_code.co_filename)

    def loading_library(frame) -> bool:
        """Whether the import machinery on this stack is loading a file of a library with importlib's own loader.

        A subclass of the loader could hand the machinery any source, so the loader's class must be exactly
        importlib's, and its path a file of the harness, an installed library or the standard library.
        """
        while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
            if frame.f_code.co_name in ("get_code", "exec_module"):
                loader = frame.f_locals.get("self")
                cls = type_(loader)
                if cls is not source_loader and cls is not sourceless_loader:
                    return False
                path = plain(vars_(loader).get("path"))
                return path is not None and kind(realpath(path)) in ("harness", "library", "transparent", "stdlib")
            frame = frame.f_back
        return False

    def describe(event: str, args: tuple) -> str:
        if event in attribute_events:
            return f"{verbs[event]} the attribute {plain(args[1]) or '?'}"
        if event in path_events:
            return f"called {event}({plain(args[0]) or '?'!r})"
        return f"called {event}"

    def refused(event: str, args: tuple) -> str | None:
        if event in path_events and not sensitive(event, args):
            return None
        if event in attribute_events and own(args[0]):
            return None  # its own classes and functions
        frame = getframe(2)  # the frame that raised the event (0: this function, 1: the hook)
        if event in ("object.__getattr__", "object.__setattr__", "sys._getframe", "compile", "exec") \
                and allowed_reader(event, frame):
            return None
        found, who = origin(frame)
        if found in ("harness", "library", "import:harness", "import:library"):
            return None
        if event == "import":  # only the candidate's own import statements are checked (not a library's imports)
            top = (plain(args[0]) or "?").split(".")[0]
            return f"imported {top}" if top in forbidden and importer(frame) == "candidate" else None
        if found == "import:candidate" and event in import_work and loading_library(frame):
            return None
        where = f" at {basename(who.f_code.co_filename)}:{who.f_lineno}" if who is not None else ""
        return describe(event, args) + where

    def hook(event: str, args: tuple) -> None:
        if event not in guarded and not event.startswith("ctypes."):
            return
        tid = get_ident()
        if tid in busy:  # an event of the hook's own frame reads (nothing here runs the candidate's code)
            return
        busy.add(tid)
        try:
            why = refused(event, args)
        finally:
            busy.discard(tid)
        if why is not None:
            report(f"kernel.py {why}: forbidden at run time (it reaches the grader's state or leaves the sandbox)")
            raise PermissionError_(f"kernel.py {why}: not allowed (grading integrity)")

    def from_candidate() -> bool:
        return origin(getframe(2))[0] in ("candidate", "import:candidate")

    sys.addaudithook(hook)
    return from_candidate
