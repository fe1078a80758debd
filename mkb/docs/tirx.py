"""The TIRx pages of the API reference that need more than a module walk: T.ptx, T.tile, tile dispatch, tvm.

T.ptx is table-driven (one table entry per PTX syntax shape), and tile primitives are chosen by a
dispatcher at compile time; both are read from the installed apache-tvm, never from a copy.
"""

from __future__ import annotations

import inspect
from collections import defaultdict

from mkb.docs.entries import Collector, Entry, Page, entry, first_paragraph, import_dotted

SCOPES = ("thread", "warp", "warpgroup", "wg", "cta", "cluster")
"""T.<scope>.<tile op>: the same tile primitive, executed cooperatively by that scope."""


def _slot_text(slot) -> str:
    choices = ", ".join(slot.choices)
    return f"`{slot.name}` ∈ {{{choices}}}" + (" (optional)" if slot.optional else "")


def _operand_text(op) -> str:
    dtype = op.dtype if isinstance(op.dtype, str) or op.dtype is None else "by modifiers"
    lanes = op.lanes if isinstance(op.lanes, int) else "n"
    parts = [op.rw if op.kind == "reg" else op.kind]
    if dtype:
        parts.append(str(dtype))
    if lanes != 1:
        parts.append(f"×{lanes} registers")
    if op.space:
        parts.append(f"space {op.space}")
    if op.choices:
        parts.append("one of " + "/".join(op.choices))
    return f"{op.name} ({', '.join(parts)})"


def _chain(entry, escape) -> str:
    tokens = []
    for slot in entry.slots:
        if len(slot.choices) == 1 and not slot.optional:
            tokens.append(escape(slot.choices[0]))
        else:
            tokens.append(f"[{slot.name}]" if slot.optional else f"{{{slot.name}}}")
    names = [op.name for op in entry.operands if not op.literal]
    return f"T.ptx.{escape(entry.family)}" + "".join(f".{t}" for t in tokens) + f"({', '.join(names)})"


def ptx_page() -> Page:
    """T.ptx: one entry per instruction family, listing each syntax shape's modifiers, operands and arch."""
    from tvm.backend.cuda.ptx.table import TABLE, escape_token

    families: dict[str, list] = defaultdict(list)
    for entry in TABLE.values():
        families[entry.family].append(entry)
    page = Page("tvm.script.tirx.ptx", note=(
        "T.ptx is the PTX dialect: an attribute chain names one instruction, e.g. "
        "`T.ptx.mbarrier.init.shared.b64(addr, count)`; modifiers are order-free, `::` is written `__` "
        "and Python keywords get a trailing `_` (`global_`). The string form keeps exact PTX text: "
        "`T.ptx[\"wgmma.fence.sync.aligned\"]()`. Destinations are ordinary leading operands; every "
        "call is a statement. Operand dtypes are checked; a `.pred` operand takes `T.bool(...)` or "
        "`T.ptx.pred(x)`. `arch` is the target the table certified the spelling on."))
    for family in sorted(families):
        lines = []
        for e in families[family]:
            lines.append(f"shape `{e.name}`: `{_chain(e, escape_token)}`" + (f" · arch {e.cert_arch}" if e.cert_arch else ""))
            if e.slots:
                lines.append("  modifiers: " + "; ".join(_slot_text(s) for s in e.slots if len(s.choices) > 1 or s.optional))
            lines.append("  operands: " + ", ".join(_operand_text(o) for o in e.operands if not o.literal))
            doc = first_paragraph(e.check.__doc__) if e.check is not None else ""
            if doc:
                lines.append(f"  constraint: {doc}")
        mnemonic = families[family][0].ptx_name
        page.entries.append(Entry(f"tvm.script.tirx.ptx.{escape_token(family)}", "PTX instruction family",
                                  summary=f"PTX `{mnemonic}`: {len(families[family])} syntax shape(s).",
                                  alias=f"T.ptx.{escape_token(family)}", extra=tuple(lines)))
    return page


def tile_page(collector: Collector) -> Page:
    """T.tile: the tile primitives, plus the scope namespaces that run them cooperatively."""
    from tvm.script import tirx as T

    page = collector.page("tvm.script.tirx.tile", T.tile, "T.tile")
    scope_doc = first_paragraph(inspect.getdoc(type(T.cta)))
    for scope in SCOPES:
        if hasattr(T, scope):
            page.entries.append(Entry(f"tvm.script.tirx.{scope}", "scope namespace", summary=scope_doc,
                                      alias=f"T.{scope}",
                                      extra=(f"`T.{scope}.<op>(...)` runs tile primitive `T.tile.<op>` at {scope} scope",)))
    page.note = ("Tile primitives are lowered by a dispatcher that picks a variant from the operands' "
                 "scopes/layouts and the target; see tvm.tirx.tile_dispatch.md for every variant and its "
                 "conditions. A failed dispatch is a compile-time error listing each variant's reason.")
    return page


def _impl_doc(case) -> str:
    for cell in case.impl.__closure__ or ():
        fn = cell.cell_contents
        if callable(fn) and inspect.getdoc(fn):
            return first_paragraph(inspect.getdoc(fn))
    return ""


def dispatch_page() -> Page:
    """Every registered CUDA dispatch variant of each tile primitive: priority and applicability checks."""
    import tvm.tirx  # noqa: F401  (registers the CUDA tile-primitive variants)
    from tvm.tirx.operator.tile_primitive.dispatcher import _DISPATCH_TABLE

    by_op: dict[str, list] = defaultdict(list)
    for (op, target), cases in _DISPATCH_TABLE.items():
        if target == "cuda":
            by_op[op.name].extend(cases)
    page = Page("tvm.tirx.tile_dispatch", note=(
        "For each tile primitive (`T.tile.<op>` / `T.<scope>.<op>`): the CUDA lowering variants, tried "
        "in priority order (highest first); a variant applies when all its checks pass. Force one with "
        "`dispatch=\"<variant>\"` where the primitive accepts it."))
    for op_name in sorted(by_op):
        cases = sorted(by_op[op_name], key=lambda c: (-c.priority, c.variant))
        extra = []
        for c in cases:
            checks = ", ".join(p.name for p in c.preds) or "none"
            doc = _impl_doc(c)
            extra.append(f"variant `{c.variant}` (priority {c.priority}; checks: {checks})" + (f": {doc}" if doc else ""))
        short = op_name.rsplit(".", 1)[-1]
        page.entries.append(Entry(f"tvm.tirx.tile_dispatch.{short}", "tile primitive dispatch",
                                  summary=f"{len(cases)} CUDA variant(s) for `{op_name}`.",
                                  alias=f"T.tile.{short}", extra=tuple(extra)))
    return page


def names_page(title: str, names: tuple[str, ...]) -> Page:
    """A page of individually named objects (e.g. tvm.compile, tvm.target.Target)."""
    page = Page(title)
    for name in names:
        page.entries.append(entry(name, import_dotted(name)))
    return page
