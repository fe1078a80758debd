"""`mkb audit`: re-check a database's stored final gradings against the judge's current rules (issue #24).

For every trial's final grading it re-scans the stored kernel.py with the current static rules
(judge/static.py, including rules added since the grading), re-scores the stored record under the strict
DSL policy (the DSL share it recorded against 0.9, or the problem's DSL_SHARE floor from the current
catalog), and says whether the grading's knock-out already used the two poisons. Nothing is re-run: a
grading that recorded no share, or a knock-out that compared bits only (before #24), can only be flagged
for a new grading. Reads the database only.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from mkb.judge import static
from mkb.records import Dsl, ProblemInfo, Status
from mkb.store import Store

STRICT_SHARE = 0.9
"""The strict policy's floor (mkb/judge/referee/policy.py STRICT_SHARE; a test keeps them equal)."""


@dataclass(frozen=True)
class AuditRow:
    """One final grading, re-checked."""

    model: str
    trial_id: str
    problem_id: str
    dsl: str
    status: str | None
    """The stored status."""
    static: list[str]
    """What the current static rules find in the stored kernel.py (empty: clean)."""
    dsl_share: float | None
    """The share the grading recorded, or for an older record its launched kernels' (None: neither)."""
    share_from: str
    """recorded (details.dsl_share) / launched kernels (an older record: its profiler kernels by origin) / none."""
    share_min: float
    """The strict floor for this problem."""
    strict: str
    """passed / failed / unknown (no share recorded) / n/a (the grading did not pass)."""
    knockout: str
    """two poisons / bits only (judged before the two-poison knock-out) / none (no knock-out recorded)."""
    verdict: str
    """would fail (a static finding, or below the strict floor) / regrade (pass not provable from the record) / ok."""


def audit(store: Store, catalog: list[ProblemInfo]) -> list[AuditRow]:
    """Every trial's final grading in the store, re-checked (ordered by model and trial)."""
    floors = {p.id: p.dsl_share_min for p in catalog}
    rows = store.rows("""
        SELECT t.model, t.trial_id, t.problem_id, t.dsl, s.status, s.kernel_source, s.record
        FROM trials t JOIN submissions s ON s.attempt_id = t.attempt_id AND s.kind = 'final'
        ORDER BY t.model, t.trial_id""")
    return [check(row, floors.get(row["problem_id"])) for row in rows]


def check(row: dict, floor: float | None) -> AuditRow:
    """One stored final grading (model, trial_id, problem_id, dsl, status, kernel_source, record) re-checked."""
    record = row["record"] if isinstance(row["record"], dict) else json.loads(row["record"] or "{}")
    details = record.get("details") or {}
    findings = [str(f) for f in static.scan(row["kernel_source"] or "", Dsl(row["dsl"]))]
    share, share_from = _share(details, row["dsl"])
    share_min = STRICT_SHARE if floor is None else floor
    passed = row["status"] == Status.PASSED
    strict = "n/a" if not passed else "unknown" if share is None else "passed" if share >= share_min else "failed"
    knocked = details.get("knockout") or {}
    knockout = ("two poisons" if isinstance(knocked, dict) and "nan" in knocked and "noise" in knocked
                else "bits only" if knocked else "none")
    if passed and (findings or strict == "failed"):
        verdict = "would fail"
    elif passed and (strict == "unknown" or knockout == "bits only"):
        verdict = "regrade"
    else:
        verdict = "ok"
    return AuditRow(model=row["model"], trial_id=row["trial_id"], problem_id=row["problem_id"], dsl=row["dsl"],
                    status=row["status"], static=findings, dsl_share=share, share_from=share_from,
                    share_min=share_min, strict=strict,
                    knockout=knockout, verdict=verdict)


def _share(details: dict, dsl: str) -> tuple[float | None, str]:
    """The recorded share; else, for records from before it existed, the launched kernels' own split of device
    time by origin (attributed by the symbols the DSL built then, the judge's rule before #24)."""
    share = details.get("dsl_share")
    if isinstance(share, int | float) and not isinstance(share, bool):
        return float(share), "recorded"
    kernels = [k for k in details.get("launched_kernels") or [] if isinstance(k, dict)]
    total = sum(float(k.get("device_ms") or 0.0) for k in kernels)
    if total <= 0:
        return None, "none"
    return sum(float(k.get("device_ms") or 0.0) for k in kernels if k.get("origin") == dsl) / total, \
        "launched kernels"


def as_dicts(rows: list[AuditRow]) -> list[dict]:
    return [asdict(r) for r in rows]
