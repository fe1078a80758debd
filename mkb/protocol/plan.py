"""Planning a protocol run from the store: which trials to reuse, run, rerun, or hold as stale."""

from __future__ import annotations

import fnmatch
from enum import StrEnum

from mkb.records import Arm, ProblemInfo, Record, Status, TrialSpec
from mkb.store import Trial
from mkb.trial import FingerprintParts


class Action(StrEnum):
    """What the plan does with one trial."""

    REUSE = "reuse"
    """Finished before with the same fingerprint: kept as is."""
    RUN = "run"
    """Never ran (or waits for a source solo that runs now)."""
    RERUN = "rerun"
    """Ended in infra_error, was interrupted, or its process died (still running): runs again, not charged."""
    STALE = "stale"
    """Finished with a different fingerprint; blocks the run unless --rerun-stale."""


def stale_reasons(old: dict | None, new: FingerprintParts) -> list[str]:
    """Which parts changed between a stored trial's fingerprint parts and the current ones."""
    if not old:
        return ["no fingerprint stored"]
    return [k for k, v in new.model_dump(mode="json").items() if old.get(k) != v]


class PlanItem(Record):
    """A trial and what the plan does with it."""

    spec: TrialSpec
    """The trial."""
    action: Action
    """reuse / run / rerun / stale."""
    reason: str = ""
    """Why (e.g. which fingerprint parts changed)."""


def expand(problems: list[ProblemInfo], arms: list[Arm], replicates: int, trial_glob: str | None = None) -> list[TrialSpec]:
    """All trials for the selection; selecting a skill arm pulls in its source solo."""
    wanted = list(dict.fromkeys(arms))
    for arm in list(wanted):
        if arm.source is not None and arm.source not in wanted:
            wanted.append(arm.source)
    order = [a for a in Arm if a in wanted]
    specs = [TrialSpec(problem=p, replicate=k, arm=a) for p in problems for k in range(1, replicates + 1) for a in order]
    if trial_glob:
        chosen = {s.trial_id for s in specs if fnmatch.fnmatch(s.trial_id, trial_glob)}
        chosen |= {s.source_trial_id for s in specs if s.trial_id in chosen and s.source_trial_id}
        specs = [s for s in specs if s.trial_id in chosen]
    return specs


def plan(specs: list[TrialSpec], stored: dict[str, Trial], current: dict[str, FingerprintParts]) -> list[PlanItem]:
    """Decide each trial's action from its stored row (trial_id -> Trial) and its current fingerprint parts.

    A skill trial whose source solo runs now also runs (its input changes); otherwise it is compared
    like any other trial, with the source's stored skill hash in its fingerprint.
    """
    items: dict[str, PlanItem] = {}
    for spec in specs:
        row = stored.get(spec.trial_id)
        source_item = items.get(spec.source_trial_id) if spec.source_trial_id else None
        if row is None:
            items[spec.trial_id] = PlanItem(spec=spec, action=Action.RUN, reason="never ran")
        elif not row.state.is_done or row.status == Status.INFRA_ERROR:
            ended = row.state if not row.state.is_done else "with an infra_error grading"
            items[spec.trial_id] = PlanItem(spec=spec, action=Action.RERUN, reason=f"last ended {ended}")
        elif source_item is not None and source_item.action in (Action.RUN, Action.RERUN):
            items[spec.trial_id] = PlanItem(spec=spec, action=Action.RUN, reason="its source solo runs now")
        elif source_item is not None and source_item.action == Action.STALE:
            items[spec.trial_id] = PlanItem(spec=spec, action=Action.STALE, reason="its source solo is stale")
        else:
            changed = stale_reasons(row.fingerprint_parts, current[spec.trial_id])
            items[spec.trial_id] = (PlanItem(spec=spec, action=Action.REUSE) if not changed else
                                    PlanItem(spec=spec, action=Action.STALE, reason=f"changed: {', '.join(changed)}"))
    return [items[s.trial_id] for s in specs]
