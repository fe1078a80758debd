"""Static policy checks of kernel.py (DESIGN §4): what the source imports, calls and patches.

They complement, never replace, the runtime checks: a clean source can still be decorative or
cheat at runtime, and the runtime checks catch that. A finding here is a policy violation before
anything runs.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from mkb.pyparse import parse
from mkb.records import Dsl

OTHER_DSL_MODULES = {Dsl.CUTEDSL: ("tvm",), Dsl.TIRX: ("cutlass",)}
FORBIDDEN_IMPORTS = {
    "triton": "Triton", "torch.utils.cpp_extension": "inline C++/CUDA extensions (load_inline)",
    "ctypes": "ctypes", "cffi": "cffi", "subprocess": "subprocess", "pty": "pty",
    "multiprocessing": "multiprocessing", "socket": "network sockets", "cupy": "CuPy", "numba": "Numba",
    "pycuda": "PyCUDA", "cuda.bindings.nvrtc": "NVRTC", "cuda.nvrtc": "NVRTC", "nvrtc": "NVRTC",
    "torch._inductor": "torch.compile internals", "torch._dynamo": "torch.compile internals",
    "mkb": "the grader's internals", "problems": "the problem set (reference / make_inputs)",
    "gc": "garbage-collector introspection", "importlib": "dynamic imports", "signal": "signal handling",
    "inspect": "frame introspection", "runpy": "running other files as code (runpy)",
    "_socket": "network sockets", "posix": "raw system calls (posix)", "_posixsubprocess": "subprocess",
    "_ctypes": "ctypes", "_multiprocessing": "multiprocessing",
    "faulthandler": "stack dumps of every thread", "tracemalloc": "allocation tracebacks",
    "_testcapi": "CPython's test internals", "_testinternalcapi": "CPython's test internals",
}
FORBIDDEN_ATTRIBUTES = {
    ("torch", "compile"): "torch.compile", ("torch", "jit"): "TorchScript (torch.jit)",
    ("torch.cuda", "graph"): "CUDA graphs", ("torch.cuda", "CUDAGraph"): "CUDA graphs",
    ("torch.cuda", "graphs"): "CUDA graphs", ("torch.cuda", "make_graphed_callables"): "CUDA graphs",
    ("torch.cuda", "jiterator"): "torch.cuda.jiterator (NVRTC)",
    ("os", "system"): "os.system", ("os", "popen"): "os.popen", ("os", "fork"): "os.fork",
    ("os", "execv"): "os.exec*", ("os", "execve"): "os.exec*", ("os", "execvp"): "os.exec*",
    ("os", "execl"): "os.exec*", ("os", "spawnv"): "os.spawn*", ("os", "posix_spawn"): "os.posix_spawn",
    ("sys", "_getframe"): "frame introspection", ("sys", "modules"): "sys.modules manipulation",
    ("sys", "meta_path"): "import-system manipulation", ("sys", "settrace"): "tracing hooks",
    ("sys", "setprofile"): "profiling hooks", ("os", "kill"): "signalling other processes",
    ("os", "killpg"): "signalling other processes",
}
FORBIDDEN_CALLS = {"exec": "exec()", "eval": "eval()", "compile": "compile() (dynamic code)",
                   "__import__": "dynamic imports", "reference": "the problem's reference()",
                   "make_inputs": "the problem's make_inputs()"}
PATCHABLE_ROOTS = ("torch", "time", "builtins", "sys", "os", "cutlass", "tvm", "tvm_ffi", "cuda", "gc")
"""Assigning into these modules (timers, synchronize, the DSL runtimes) is tampering."""
KERNEL_LIBRARIES = {
    "quack": "quack-kernels", "flash_attn": "flash-attn", "flashinfer": "flashinfer", "deep_gemm": "DeepGEMM",
    "sgl_kernel": "sgl-kernel", "vllm": "vLLM", "xformers": "xFormers", "liger_kernel": "Liger Kernel",
    "transformer_engine": "Transformer Engine", "cutlass_library": "the CUTLASS C++ kernel library",
}
"""Published GPU kernel libraries (module -> project): DESIGN §4 forbids kernels imported from them. Only a
trusted anchor's grading (mkb.judge.anchor: never the agent's submit tool, `mkb verify` or the protocol) may
import its own library's modules."""
INLINE_SOURCE_MARKERS = ("__global__", ".visible .entry", "extern \"C\" __global__", ".version 8", "asm volatile")


@dataclass(frozen=True)
class Finding:
    """One static policy violation."""

    line: int
    rule: str
    detail: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.detail}"


class _Visitor(ast.NodeVisitor):
    def __init__(self, dsl: Dsl, defined: set[str], allow: tuple[str, ...]):
        self.dsl, self.findings, self.aliases, self.defined, self.allow = dsl, [], {}, defined, allow

    def add(self, node: ast.AST, rule: str, detail: str) -> None:
        self.findings.append(Finding(getattr(node, "lineno", 0), rule, detail))

    def _module(self, node: ast.AST, name: str) -> None:
        for other in OTHER_DSL_MODULES[self.dsl]:
            if name == other or name.startswith(other + "."):
                self.add(node, "other_dsl", f"imports {name}: the other DSL is forbidden in a {self.dsl} kernel")
        for forbidden, what in FORBIDDEN_IMPORTS.items():
            if name == forbidden or name.startswith(forbidden + "."):
                self.add(node, "forbidden_import", f"imports {name} ({what} is forbidden)")
        for library, project in KERNEL_LIBRARIES.items():
            if (name == library or name.startswith(library + ".")) and library not in self.allow:
                self.add(node, "kernel_library", f"imports {name}: kernels imported from a kernel library "
                                                 f"({project}) are forbidden; write the kernel in the DSL")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._module(node, alias.name)
            self.aliases[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            self.add(node, "forbidden_import", "relative import: kernel.py must be self-contained")
        base = node.module or ""
        self._module(node, base)
        for alias in node.names:
            self._module(node, f"{base}.{alias.name}")
            self.aliases[alias.asname or alias.name] = f"{base}.{alias.name}"
        self.generic_visit(node)

    def _dotted(self, node: ast.AST) -> str | None:
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        parts.append(self.aliases.get(node.id, node.id))
        return ".".join(reversed(parts))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        dotted = self._dotted(node)
        if dotted:
            owner, _, attr = dotted.rpartition(".")
            if (owner, attr) in FORBIDDEN_ATTRIBUTES:
                self.add(node, "forbidden_call", f"uses {dotted} ({FORBIDDEN_ATTRIBUTES[(owner, attr)]} is forbidden)")
            if attr in ("reference", "make_inputs"):
                self.add(node, "reference_call", f"uses {dotted}: calling the problem's {attr} is forbidden")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        name = node.func.id if isinstance(node.func, ast.Name) else None
        if name in FORBIDDEN_CALLS and name not in self.defined and name not in self.aliases:
            self.add(node, "forbidden_call", f"calls {FORBIDDEN_CALLS[node.func.id]}")
        if isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr") and node.args:
            target = self._dotted(node.args[0]) or ""
            if target.split(".")[0] in PATCHABLE_ROOTS:
                self.add(node, "patching", f"{node.func.id}() on {target}: patching library entry points is forbidden")
        self.generic_visit(node)

    def _check_target(self, target: ast.AST) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._check_target(element)
        elif isinstance(target, ast.Attribute):
            dotted = self._dotted(target) or ""
            if dotted.split(".")[0] in PATCHABLE_ROOTS and not dotted.startswith(("torch.backends.",)):
                self.add(target, "patching", f"assigns {dotted}: patching library entry points is forbidden")

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._check_target(target)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_target(node.target)
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and any(m in node.value for m in INLINE_SOURCE_MARKERS):
            self.add(node, "inline_source", "a string holds CUDA C/PTX source: raw CUDA is forbidden")


def scan(source: str, dsl: Dsl, allow: tuple[str, ...] = ()) -> list[Finding]:
    """Every static policy finding in a kernel's source (empty when clean).

    A file that does not parse yields no finding: importing it reports the syntax error. allow names the
    KERNEL_LIBRARIES modules a trusted anchor's grading may import (mkb.judge.anchor); nothing else is waived.
    """
    try:
        tree = parse(source)
    except SyntaxError:
        return []
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    visitor = _Visitor(Dsl(dsl), defined, tuple(allow))
    visitor.visit(tree)
    return visitor.findings
