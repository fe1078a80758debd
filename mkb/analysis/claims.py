"""The paper's claims (artifact/claims.json) and the same numbers reproduced from a database."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from mkb.analysis.data import DIRECTIONS, Results
from mkb.analysis.params import footnote
from mkb.analysis.render import Column, Table
from mkb.analysis.summaries import POOLED_LABEL, select, summarize_cells

METRICS = ("dgm", "help", "harm")
SCOPES = ("model_direction", "standing")


@dataclass(frozen=True)
class Claim:
    """One number the paper reports: a range over Table 1 rows, or one value for a standing group."""

    id: str
    statement: str
    metric: str
    """dgm, help or harm."""
    scope: str
    """model_direction: a range over (model, direction) rows; standing: one pooled standing group."""
    kind: str
    """range (low, high) or value."""
    low: float | None = None
    high: float | None = None
    value: float | None = None
    group: str | None = None
    """above / same / below, for scope standing."""
    evidence: str = ""
    """Where the report shows it."""

    def __post_init__(self) -> None:
        if self.metric not in METRICS or self.scope not in SCOPES or self.kind not in ("range", "value"):
            raise ValueError(f"claim {self.id}: unknown metric, scope or kind")
        if (self.kind == "range") != (self.low is not None and self.high is not None):
            raise ValueError(f"claim {self.id}: a range needs low and high, a value needs value")


def load_claims(path: Path) -> list[Claim]:
    """Read the claims file (artifact/claims.json)."""
    return [Claim(**c) for c in json.loads(Path(path).read_text())["claims"]]


def _pct(x: float | None) -> str:
    return "–" if x is None or math.isnan(x) else f"{100 * x:.1f}%"


def _basis(results: Results) -> tuple[str, set[str]]:
    """The models compared with the paper: every real model; the oracle only when it is all there is."""
    real = [m for m in results.models if not m.is_oracle]
    chosen = real or list(results.models)
    if len(chosen) == 1:
        return chosen[0].label, {chosen[0].name}
    return (POOLED_LABEL if real else "all oracles"), {m.name for m in chosen}


def _verdict_range(low: float, high: float, claim: Claim) -> str:
    if low >= claim.low and high <= claim.high:
        return "inside claimed range"
    return "overlaps claimed range" if low <= claim.high and high >= claim.low else "disjoint from claimed range"


def compare(results: Results, claims: list[Claim]) -> list[dict]:
    """One row per claim: claimed vs reproduced, with the basis and a plain verdict."""
    label, names = _basis(results)
    rows = []
    for claim in claims:
        row = {"claim": claim.id, "statement": claim.statement, "evidence": claim.evidence,
               "claimed_low": claim.low, "claimed_high": claim.high, "claimed_value": claim.value,
               "reproduced_low": None, "reproduced_high": None, "reproduced_value": None,
               "ci_low": None, "ci_high": None, "basis": "", "verdict": "no data"}
        if claim.scope == "model_direction":
            values = []
            for model in sorted(names):
                for direction in DIRECTIONS:
                    cells = select(results.cells, model=model, direction=direction)
                    if any(c.complete for c in cells):
                        s = summarize_cells(cells, results.params, "claims-unused")
                        values.append(getattr(s, claim.metric))
            row["basis"] = f"{len(values)} model x direction rows ({label})"
            row["claimed"] = f"{_pct(claim.low)} … {_pct(claim.high)}"
            if values:
                row |= {"reproduced_low": min(values), "reproduced_high": max(values),
                        "verdict": _verdict_range(min(values), max(values), claim)}
            row["reproduced"] = f"{_pct(row['reproduced_low'])} … {_pct(row['reproduced_high'])}"
        else:
            cells = [c for c in select(results.cells, model=lambda m: m in names) if c.standing == claim.group]
            s = summarize_cells(cells, results.params, f"standing/{label}/{claim.group}")
            row["basis"] = f"{s.cells} cells with source {claim.group} ({label})"
            row["claimed"] = _pct(claim.value)
            if s.cells:
                point, (low, high) = getattr(s, claim.metric), getattr(s, f"{claim.metric}_ci")
                row |= {"reproduced_value": point, "ci_low": low, "ci_high": high,
                        "verdict": f"claim {'inside' if low <= claim.value <= high else 'outside'} "
                                   f"{results.params.confidence:.0%} CI"}
            row["reproduced"] = (f"{_pct(row['reproduced_value'])} [{_pct(row['ci_low'])}, {_pct(row['ci_high'])}]"
                                 if s.cells else "–")
        rows.append(row)
    return rows


def claims_table(results: Results, claims: list[Claim]) -> Table:
    """The comparison as a report table (claims.md / .csv / .tex)."""
    columns = (Column("claim", "Claim"), Column("statement", "Paper"), Column("claimed", "Claimed"),
               Column("reproduced", "Reproduced"), Column("basis", "Basis"), Column("verdict", "Verdict"))
    oracle_only = all(m.is_oracle for m in results.models)
    notes = ("Ranges: min … max over (model, direction) rows of Table 1; standing rates pool the "
             "models and both directions, with the bootstrap interval over problems.",)
    if oracle_only:
        notes += ("Only the oracle (reference agent) is in this database: the comparison checks the "
                  "pipeline, not the paper's model results.",)
    return Table("claims", "The paper's claims: claimed vs reproduced", columns, tuple(compare(results, claims)),
                 notes, footnote(results.params))
