"""The API reference's building blocks: entries, pages, and the collector that walks modules into pages."""

from __future__ import annotations

import enum
import functools
import importlib
import inspect
import re
from dataclasses import dataclass, field

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


def entry(name: str, obj, alias: str = "") -> Entry:
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


class Collector:
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
                page.entries.append(entry(qual, obj, alias))
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
            page.entries.append(entry(qual, obj, alias))
            if inspect.isclass(obj) and not issubclass(obj, enum.Enum):
                for mname, member in _members(obj):
                    page.entries.append(entry(f"{qual}.{mname}", member,
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


def import_dotted(name: str):
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
