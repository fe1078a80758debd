"""API reference for agents: one greppable Markdown entry per public API, generated from the installed DSLs.

Nothing here is committed: the text comes from the user's own installation (CuTe DSL's docstrings are
under NVIDIA's EULA), so `mkb docs build` runs at install/image-build time and writes
problems/docs/<dsl>/api/ (git-ignored). Each DSL is generated in its own child process, in parallel;
a module that fails to import is skipped and listed in the index.
"""

from __future__ import annotations

import enum
import functools
import importlib
import inspect
import json
import re
import subprocess
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mkb.errors import MkbError

CUTEDSL_MODULES = (
    "cutlass.cute.math", "cutlass.cute", "cutlass.cute.arch", "cutlass.cute.nvgpu",
    "cutlass.cute.nvgpu.cpasync", "cutlass.cute.nvgpu.warp", "cutlass.cute.nvgpu.warpgroup",
    "cutlass.cute.nvgpu.tcgen05", "cutlass.cute.runtime", "cutlass.cute.testing", "cutlass.cute.export",
    "cutlass", "cutlass.tensor_utils", "cutlass.pipeline", "cutlass.memory", "cutlass.utils",
    "cutlass.utils.hopper_helpers",
    "cutlass.utils.blackwell_helpers", "cutlass.utils.blockscaled_layout", "cutlass.torch",
)
"""CuTe DSL modules documented, in order: an object re-exported by a later module is listed there as an alias."""

TIRX_MODULES = (
    "tvm.script.tirx", "tvm.script.tirx.cuda", "tvm.script.tirx.ptx", "tvm.script.tirx.tile",
    "tvm.script.tirx.s_tir", "tvm.script.tirx.ptx_legacy", "tvm.tirx", "tvm.tirx.layout",
    "tvm.tirx.lang.alloc_pool", "tvm.tirx.lang.pipeline", "tvm.tirx.lang.smem_desc",
    "tvm.tirx.lang.tile_scheduler", "tvm.tirx.lang.warp_role", "tvm.tirx.tile_dispatch", "tvm",
)
"""TIRx pages: the `T` namespace (tvm.script.tirx) and its intrinsic namespaces first, then tvm.tirx."""

TVM_TOP = ("tvm.compile", "tvm.IRModule", "tvm.target.Target", "tvm.runtime.load_module",
           "tvm.runtime.enabled", "tvm.support.nvcc.compile_cuda")
"""The handful of tvm names a TIRx kernel needs around it (compile, target, load); the `tvm` page."""

PACKAGES = {"cutedsl": ("nvidia-cutlass-dsl",), "tirx": ("apache-tvm", "apache-tvm-ffi")}
_INTERNAL_PARAMS = {"loc", "ip"}  # CuTe's MLIR location/insertion point: never passed by users
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_FORWARD_REF = re.compile(r"ForwardRef\('([^']+)'\)")
_DOTTED = re.compile(r"\b(?:[A-Za-z_][A-Za-z0-9_]*\.)+([A-Za-z_][A-Za-z0-9_]*)")


@dataclass(frozen=True)
class Entry:
    """One API: heading, signature, kind and the first paragraph of its docstring."""

    name: str
    kind: str
    signature: str = ""
    summary: str = ""
    defined_in: str = ""
    alias: str = ""
    extra: tuple[str, ...] = ()

    def render(self) -> str:
        head = f"### {self.name}" + (f"  ({self.alias})" if self.alias else "")
        where = f" · defined in `{self.defined_in}`" if self.defined_in else ""
        lines = [head, f"{self.kind}{where}"]
        if self.signature:
            lines.append(f"`{self.signature}`")
        lines += [f"  - {x.strip()}" if x.startswith("  ") else f"- {x}" for x in self.extra]
        if self.summary:
            lines += ["", self.summary]
        return "\n".join(lines) + "\n"


@dataclass
class Page:
    """One Markdown file: the entries of one module or namespace."""

    module: str
    entries: list[Entry] = field(default_factory=list)
    aliases: list[tuple[str, str]] = field(default_factory=list)
    note: str = ""


@dataclass(frozen=True)
class PageInfo:
    file: str
    entries: int
    lines: int
    bytes: int


@dataclass(frozen=True)
class BuildReport:
    """What one DSL's build wrote and what it skipped."""

    dsl: str
    out_dir: str
    pages: list[PageInfo]
    skipped: list[tuple[str, str]]
    versions: dict[str, str]
    seconds: float

    @property
    def n_entries(self) -> int:
        return sum(p.entries for p in self.pages)


def first_paragraph(doc: str | None) -> str:
    """The docstring's first paragraph, joined onto one line; empty when there is no docstring."""
    para = (doc or "").strip().split("\n\n")[0]
    return _ADDRESS.sub("", " ".join(line.strip() for line in para.splitlines()))


def signature_of(obj, name: str) -> str:
    """`name(params) -> ret` with module prefixes and CuTe's internal loc/ip parameters removed."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return ""
    params = [p for p in sig.parameters.values() if p.name not in _INTERNAL_PARAMS]
    text = str(sig.replace(parameters=params))
    return name + _DOTTED.sub(r"\1", _FORWARD_REF.sub(r"\1", _ADDRESS.sub("", text)))


def _doc(obj) -> str:
    if isinstance(obj, functools.partial):
        return inspect.getdoc(obj.func) or ""
    return inspect.getdoc(obj) or ""


def _kind(obj) -> str:
    if inspect.isclass(obj):
        return "enum" if issubclass(obj, enum.Enum) else "class"
    if isinstance(obj, property):
        return "property"
    if inspect.ismodule(obj):
        return "module"
    if inspect.isfunction(obj) or inspect.isbuiltin(obj) or inspect.ismethod(obj) or isinstance(obj, functools.partial):
        return "function"
    return "callable object" if callable(obj) else "value"


def _entry(name: str, obj, alias: str = "") -> Entry:
    kind = _kind(obj)
    extra: tuple[str, ...] = ()
    sig = ""
    short = name.rsplit(".", 1)[-1]
    if kind == "enum":
        members = list(obj.__members__)
        extra = (f"members: {', '.join(members[:60])}{' …' if len(members) > 60 else ''}",)
    elif kind == "value":
        extra = (f"value: `{_ADDRESS.sub('', repr(obj))[:120]}`",)
    elif kind == "property":
        obj = obj.fget
    else:
        sig = signature_of(obj, short)
    defined = getattr(obj.func if isinstance(obj, functools.partial) else obj, "__module__", "") or ""
    return Entry(name, kind, sig, first_paragraph(_doc(obj)) if kind != "value" else "",
                 defined if isinstance(defined, str) else "", alias, extra)


def _public_names(mod) -> list[str]:
    """__all__ plus every other non-underscore name: some helpers in use are missing from __all__."""
    names = set(getattr(mod, "__all__", None) or ()) | {n for n in dir(mod) if not n.startswith("_")}
    return sorted(n for n in names if hasattr(mod, n))


def _is_own(obj, roots: tuple[str, ...]) -> bool:
    """Whether obj belongs to the documented packages (not typing, functools, numpy, ...)."""
    if isinstance(obj, functools.partial):
        obj = obj.func
    module = getattr(obj, "__module__", None) or getattr(type(obj), "__module__", "")
    return isinstance(module, str) and module.split(".")[0] in roots


def _members(cls) -> list[tuple[str, object]]:
    out = []
    for name, raw in sorted(vars(cls).items()):
        if name.startswith("_"):
            continue
        if isinstance(raw, (staticmethod, classmethod)):
            raw = raw.__func__
        if isinstance(raw, property) or inspect.isfunction(raw) or inspect.isbuiltin(raw) \
                or inspect.ismethoddescriptor(raw):
            out.append((name, raw))
    return out


class _Collector:
    """Walks modules and namespaces in order; each object is documented once, later sightings are aliases."""

    def __init__(self, roots: tuple[str, ...], paged: tuple[str, ...] = ()):
        self.roots = roots
        self.paged = set(paged)  # namespaces with a page of their own are not expanded elsewhere
        self.seen: dict[int, str] = {}

    def page(self, title: str, ns, alias_prefix: str = "") -> Page:
        page = Page(title)
        for name in _public_names(ns):
            obj = getattr(ns, name)
            if inspect.ismodule(obj) or not _is_own(obj, self.roots):
                continue
            qual, alias = f"{title}.{name}", f"{alias_prefix}.{name}" if alias_prefix else ""
            if _is_namespace(obj) and not inspect.isclass(obj):  # e.g. T.cuda.wgmma: document its members here
                page.entries.append(_entry(qual, obj, alias))
                if qual in self.paged:
                    continue
                inner = self.page(qual, obj, alias)
                page.entries += inner.entries
                page.aliases += inner.aliases
                continue
            key = id(obj)
            if (inspect.isclass(obj) or inspect.isroutine(obj)) and key in self.seen:
                page.aliases.append((qual, self.seen[key]))
                continue
            self.seen[key] = qual
            page.entries.append(_entry(qual, obj, alias))
            if inspect.isclass(obj) and not issubclass(obj, enum.Enum):
                for mname, member in _members(obj):
                    page.entries.append(_entry(f"{qual}.{mname}", member,
                                               f"{alias}.{mname}" if alias else ""))
        return _collapse(page)


def _is_namespace(obj) -> bool:
    return type(obj).__name__.endswith("Namespace")


def _collapse(page: Page) -> Page:
    """Fold runs of identical entries (e.g. T.float16x2 … T.float16x64) into one entry naming them all."""
    groups: dict[tuple, list[Entry]] = {}
    for e in page.entries:
        groups.setdefault((e.kind, e.signature.split("(", 1)[-1], e.summary, e.defined_in), []).append(e)
    out = []
    for e in page.entries:
        group = groups[(e.kind, e.signature.split("(", 1)[-1], e.summary, e.defined_in)]
        if len(group) < 4 or not e.summary or e.kind in ("class", "enum"):
            out.append(e)
        elif group[0] is e:
            names = ", ".join(f"`{g.name.rsplit('.', 1)[-1]}`" for g in group[1:])
            out.append(Entry(e.name, e.kind, e.signature, e.summary, e.defined_in, e.alias,
                             e.extra + (f"same API under: {names}",)))
    page.entries = out
    return page


def _import(name: str):
    """Import a dotted path that may end in attributes (tvm.script.tirx.cuda is T.cuda)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(name)


def cutedsl_pages() -> tuple[list[Page], list[tuple[str, str]]]:
    """One page per CuTe DSL module (CUTEDSL_MODULES); modules that fail to import are returned as skipped."""
    collector, pages, skipped = _Collector(("cutlass",)), [], []
    for name in CUTEDSL_MODULES:
        try:
            pages.append(collector.page(name, _import(name)))
        except Exception as exc:  # an individual submodule may not import on this installation
            skipped.append((name, f"{type(exc).__name__}: {exc}".splitlines()[0][:200]))
    return pages, skipped


def tirx_pages() -> tuple[list[Page], list[tuple[str, str]]]:
    """Pages for T (tvm.script.tirx) and its cuda/ptx/tile namespaces, tvm.tirx, tile dispatch and tvm."""
    from mkb import docs_tirx

    collector, pages, skipped = _Collector(("tvm", "tvm_ffi"), TIRX_MODULES), [], []
    special = {"tvm.script.tirx.ptx": docs_tirx.ptx_page, "tvm.tirx.tile_dispatch": docs_tirx.dispatch_page,
               "tvm": lambda: docs_tirx.names_page("tvm", TVM_TOP),
               "tvm.script.tirx.tile": lambda: docs_tirx.tile_page(collector)}
    for name in TIRX_MODULES:
        try:
            if name in special:
                pages.append(special[name]())
            else:
                alias = "T" + name[len("tvm.script.tirx"):] if name.startswith("tvm.script.tirx") else ""
                pages.append(collector.page(name, _import(name), alias))
        except Exception as exc:
            skipped.append((name, f"{type(exc).__name__}: {exc}".splitlines()[0][:200]))
    return pages, skipped


def _versions(dsl: str) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in PACKAGES[dsl]:
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def render_page(page: Page, dsl: str, versions: dict[str, str]) -> str:
    """The Markdown text of one page: a header, the entries, then the aliases."""
    made_from = ", ".join(f"{k} {v}" for k, v in versions.items())
    lines = [f"# {page.module}", "",
             f"Generated by `mkb docs build` from the installed {made_from}. {len(page.entries)} entries; "
             f"each starts with a `### <qualified name>` line. Full docstrings: "
             f"`python -c \"help({page.module.replace('tvm.script.tirx', 'T')}.NAME)\"`"
             + (" (with `from tvm.script import tirx as T`)." if dsl == "tirx" else "."), ""]
    if page.note:
        lines += [page.note, ""]
    text = "\n".join(lines) + "\n" + "\n".join(e.render() for e in page.entries)
    if page.aliases:
        text += "\n## Also exported here (documented under another name)\n\n"
        text += "\n".join(f"- `{a}` = `{c}`" for a, c in page.aliases) + "\n"
    return text


def write_pages(dsl: str, pages: list[Page], skipped: list[tuple[str, str]], out_dir: Path,
                seconds: float) -> BuildReport:
    """Write one .md per page plus INDEX.md (pages, sizes, skipped modules) into out_dir (replaced)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("*.md"):
        old.unlink()
    versions = _versions(dsl)
    infos = []
    for page in pages:
        text = render_page(page, dsl, versions)
        path = out_dir / f"{page.module}.md"
        path.write_text(text, encoding="utf-8")
        infos.append(PageInfo(path.name, len(page.entries), text.count("\n"), len(text.encode())))
    (out_dir / "INDEX.md").write_text(render_index(dsl, infos, skipped, versions), encoding="utf-8")
    return BuildReport(dsl, str(out_dir), infos, skipped, versions, round(seconds, 2))


def render_index(dsl: str, infos: list[PageInfo], skipped: list[tuple[str, str]], versions: dict[str, str]) -> str:
    """api/INDEX.md: every page with its size, and what could not be imported."""
    lines = [f"# API reference ({dsl}): index", "",
             "Generated from the installed " + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".",
             "Every API is one entry starting `### <qualified name>`; find one with",
             "`grep -rn '^### .*NAME' docs/api/`, then read around the line number.", "",
             "| page | entries | lines | KiB |", "|---|---:|---:|---:|"]
    lines += [f"| {i.file} | {i.entries} | {i.lines} | {i.bytes / 1024:.0f} |" for i in infos]
    lines += ["", f"Total: {sum(i.entries for i in infos)} entries in {len(infos)} pages."]
    if skipped:
        lines += ["", "## Skipped (failed to import here)", ""] + [f"- `{m}`: {why}" for m, why in skipped]
    return "\n".join(lines) + "\n"


def build_dsl(dsl: str, out_dir: Path) -> BuildReport:
    """Generate one DSL's reference in this process (imports the DSL)."""
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pages, skipped = cutedsl_pages() if dsl == "cutedsl" else tirx_pages()
    return write_pages(dsl, pages, skipped, out_dir, time.perf_counter() - start)


def build(out_dirs: dict[str, Path], timeout_s: float = 300) -> list[BuildReport]:
    """Generate each DSL's reference in its own child process, all at once; returns their reports.

    Raises:
        MkbError: a child failed as a whole (its DSL does not import at all), with its stderr tail.
    """
    procs = {dsl: subprocess.Popen([sys.executable, "-m", "mkb.docs", dsl, str(out)], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True) for dsl, out in out_dirs.items()}
    reports, errors = [], []
    for dsl, proc in procs.items():
        out, err = proc.communicate(timeout=timeout_s)
        if proc.returncode != 0:
            errors.append(f"{dsl}: {err.strip()[-500:]}")
            continue
        data = json.loads(out.strip().splitlines()[-1])
        data["pages"] = [PageInfo(**p) for p in data["pages"]]
        data["skipped"] = [tuple(s) for s in data["skipped"]]
        reports.append(BuildReport(**data))
    if errors:
        raise MkbError("docs build failed for " + "; ".join(errors)
                       + ". Check that the DSL imports: python -c 'import cutlass.cute' / 'import tvm.tirx'.")
    return reports


def main(argv: list[str]) -> int:
    """Child entry: python -m mkb.docs DSL OUT_DIR; prints the BuildReport as one JSON line."""
    dsl, out_dir = argv
    report = build_dsl(dsl, Path(out_dir))
    print(json.dumps(asdict(report)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
