"""Stored eager baselines and noise floors (issue #27): find one, keep the first measured, read the floors."""

from __future__ import annotations

from mkb.store.database import Store
from mkb.store.rows import EagerBaseline, NoiseFloor


def find_baseline(store: Store, fingerprint: str) -> EagerBaseline | None:
    """The baseline stored for exactly this fingerprint, or None (then it is measured again)."""
    found = store.select(EagerBaseline, "fingerprint = ?", [fingerprint])
    return found[0] if found else None


def keep_baseline(store: Store, measured: EagerBaseline) -> EagerBaseline:
    """Store a measured baseline unless one with its fingerprint is there already; return the stored one.

    Concurrent final gradings of one problem may each measure a baseline: the first stored wins, and every
    grading then compares its kernel with that one."""
    with store.transaction() as db:
        taken = db.execute("SELECT count(*) FROM eager_baselines WHERE fingerprint = ?",
                           [measured.fingerprint]).fetchone()[0]
        if not taken:
            store.upsert(measured.table, measured.columns(), measured.keys, db)
    return find_baseline(store, measured.fingerprint)


def put_floor(store: Store, floor: NoiseFloor) -> None:
    """Record a variant's calibration (replacing an earlier one of the same variant, GPU and timing mode)."""
    store.put(floor)


def problem_floors(store: Store, timing: str = "paper") -> dict[str, float]:
    """Each calibrated problem's noise floor: the largest spread among its variants' calibrations (any GPU)."""
    return {r["problem_id"]: float(r["floor"]) for r in store.rows(
        "SELECT problem_id, floor FROM problem_floors WHERE timing = ?", [timing])}
