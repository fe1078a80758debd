"""Fidelity to the original benchmark: the per-family tables in problems/fidelity/ and docs/fidelity.md.

Each slot has one table in problems/fidelity/<family>.toml naming the original MetaKernelBench
file it reproduces, a verdict (same / minor / deviation), what still differs and why. The
catalog's check requires exactly one row per problem; docs/fidelity.md is rendered from the rows.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from pydantic import ValidationError, field_validator, model_validator

from mkb import paper
from mkb.errors import ProblemFormatError
from mkb.records import FAMILIES, ProblemInfo, Record

VERDICTS = ("same", "minor", "deviation")
ORIGINAL_REPO = "YIGE24/MetaKernelBench"
SLOT_RE = re.compile(r"^p(\d{2})$")


class FidelityRow(Record):
    """How one of our problems compares with the original benchmark's problem in the same slot."""

    slot: str
    """Problem id, p01..p74."""
    family: str
    """The family file the row sits in."""
    original: str
    """The original's problem file or recipe, as a path in its repository (problems/<family>/...)."""
    verdict: str
    """same (nothing material differs), minor (documented small differences) or deviation (material, kept)."""
    differs: str = ""
    """What still differs from the original; empty only for 'same'."""
    why: str = ""
    """Why a difference is kept; required unless the verdict is 'same'."""

    @field_validator("verdict")
    @classmethod
    def _known_verdict(cls, value: str) -> str:
        if value not in VERDICTS:
            raise ValueError(f"verdict must be one of {', '.join(VERDICTS)}, not {value!r}")
        return value

    @field_validator("original")
    @classmethod
    def _original_path(cls, value: str) -> str:
        if not value.startswith("problems/") or value.strip() != value:
            raise ValueError(f"original must be a path in the original's repository (problems/...), not {value!r}")
        return value

    @model_validator(mode="after")
    def _explained(self) -> FidelityRow:
        if self.verdict == "same" and (self.differs or self.why):
            raise ValueError("a 'same' row has empty differs and why")
        if self.verdict != "same" and not (self.differs.strip() and self.why.strip()):
            raise ValueError(f"a '{self.verdict}' row needs both differs and why")
        return self

    @property
    def number(self) -> int:
        return int(self.slot[1:])


def fidelity_dir(problems_dir: Path) -> Path:
    """Where the family tables live: problems/fidelity/."""
    return Path(problems_dir) / "fidelity"


def load_rows(problems_dir: Path) -> list[FidelityRow]:
    """Every row of every family table, sorted by slot.

    Raises:
        ProblemFormatError: a file is not one of the families, is not valid TOML, or a row is malformed.
    """
    rows = []
    for path in sorted(fidelity_dir(problems_dir).glob("*.toml")):
        if path.name == "protocol.toml":  # the protocol's points: mkb.paper
            continue
        where = f"fidelity/{path.name}"
        if path.stem not in FAMILIES:
            raise ProblemFormatError(f"{where}: name the file after a family ({', '.join(FAMILIES)})")
        try:
            tables = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ProblemFormatError(f"{where}: not valid TOML ({exc}). Fix the file and run again.") from None
        for slot, fields in tables.items():
            if not SLOT_RE.match(slot) or not isinstance(fields, dict):
                raise ProblemFormatError(f"{where}: [{slot}] must be a table named like [p07]")
            unknown = set(fields) - {"original", "verdict", "differs", "why"}
            if unknown:
                raise ProblemFormatError(f"{where}: [{slot}] has unknown keys {sorted(unknown)}")
            try:
                rows.append(FidelityRow(slot=slot, family=path.stem, **fields))
            except ValidationError as exc:
                first = exc.errors()[0]
                raise ProblemFormatError(f"{where}: [{slot}] {first['msg'].removeprefix('Value error, ')}") from None
    return sorted(rows, key=lambda r: r.number)


def check_rows(rows: list[FidelityRow], catalog: list[ProblemInfo]) -> None:
    """No slot has two rows, and every row names a problem of its file's family.

    Raises:
        ProblemFormatError: the first duplicate row, or row without a problem.
    """
    problems = {p.id: p for p in catalog}
    seen: set[str] = set()
    for row in rows:
        if row.slot in seen:
            raise ProblemFormatError(f"fidelity: [{row.slot}] appears twice; keep one row per problem")
        seen.add(row.slot)
        info = problems.get(row.slot)
        if info is None:
            raise ProblemFormatError(f"fidelity/{row.family}.toml: [{row.slot}] names no problem; remove the row")
        if info.family != row.family:
            raise ProblemFormatError(f"fidelity/{row.family}.toml: [{row.slot}] belongs in {info.family}.toml")


def missing(rows: list[FidelityRow], catalog: list[ProblemInfo]) -> list[str]:
    """Problems without a row (the catalog's check requires none)."""
    have = {r.slot for r in rows}
    return [p.id for p in catalog if p.id not in have]


def require_complete(rows: list[FidelityRow], catalog: list[ProblemInfo]) -> None:
    """check_rows, and every problem has a row.

    Raises:
        ProblemFormatError: a row is wrong, or a problem has none.
    """
    check_rows(rows, catalog)
    if absent := missing(rows, catalog):
        raise ProblemFormatError(f"fidelity: no row for {', '.join(absent[:5])}{' ...' if len(absent) > 5 else ''}; "
                                 f"add one to problems/fidelity/<family>.toml")


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render(rows: list[FidelityRow], catalog: list[ProblemInfo]) -> str:
    """docs/fidelity.md: a count of verdicts, then one row per slot, family by family."""
    names = {p.id: p.name for p in catalog}
    counts = {v: sum(r.verdict == v for r in rows) for v in VERDICTS}
    lines = [
        "# Fidelity to the original MetaKernelBench",
        "",
        "<!-- generated by `mkb problems fidelity` from problems/fidelity/*.toml; do not edit -->",
        "",
        f"Each of our {len(catalog)} problems against the original benchmark's problem in the same slot "
        f"([{ORIGINAL_REPO}](https://github.com/{ORIGINAL_REPO}): problem files under `problems/<family>/` and "
        "recipes under `problems/_sol_execbench/`). Facts (operation, constants, inputs and outputs, "
        "workload) carry over; every file here is written anew. **same**: nothing material differs; "
        "**minor**: small documented differences; **deviation**: a material difference, kept for the "
        "reason given.",
        "",
        f"Verdicts: {counts['same']} same, {counts['minor']} minor, {counts['deviation']} deviation.",
        "",
        "The 32 slots whose original is a problem file are also run side by side with it on the CPU "
        "(`scripts/fidelity_side_by_side.py ORIGINAL_CHECKOUT`: the same inputs from our `make_inputs` to both "
        "references, every output compared natively and on the fp64 anchor, in-place outputs through `MUTATES`, "
        "constants and full-scale input shapes compared); the last run is "
        "`artifact/cpu/fidelity_side_by_side_2026-12-08.json`: all 32 match.",
    ]
    if absent := missing(rows, catalog):
        lines += ["", f"**Not yet compared** ({len(absent)}): {', '.join(absent)}."]
    for family in FAMILIES:
        members = [r for r in rows if r.family == family]
        if not members:
            continue
        lines += ["", f"## {family}", "", "| slot | ours | original | verdict | what differs | why |",
                  "|---|---|---|---|---|---|"]
        for r in members:
            lines.append(f"| {r.slot} | `{names.get(r.slot, '?')}` | `{r.original.rsplit('/', 1)[-1]}` | {r.verdict} "
                         f"| {_cell(r.differs) or '-'} | {_cell(r.why) or '-'} |")
    return "\n".join(lines) + "\n"


def sync(problems_dir: Path, catalog: list[ProblemInfo], doc: Path, write: bool = True) -> bool:
    """Check the rows against the catalog and (re)write doc; True when doc was out of date.

    Problems without a row are listed in the document (require_complete is the strict check). The
    protocol section is added when the problems directory has fidelity/protocol.toml.

    Raises:
        ProblemFormatError: a row is malformed, repeated or names no problem of its family.
    """
    rows = load_rows(problems_dir)
    check_rows(rows, catalog)
    text = render(rows, catalog)
    if paper.points_path(problems_dir).exists():  # a problem set of one's own may have no protocol rows
        text = paper.with_section(text, paper.render_section(paper.load_points(problems_dir)))
    stale = not doc.exists() or doc.read_text() != text
    if stale and write:
        doc.parent.mkdir(parents=True, exist_ok=True)
        doc.write_text(text)
    return stale
