"""Regrading (issue #27): the final kernels of a results database graded again in the final-grading mode.

No agent runs again. For each finished trial of the selected models and problems, the kernel source of
its current attempt's last final grading is graded anew (Judging.final: several fresh processes, the
stored eager baseline); the new record is added to the attempt's submissions as a later final grading
(details.regrade names the grading it replaces and keeps its figures), and the trial takes its status
and timings. A regrade that ends in infra_error changes nothing (it is the judge's failure; run it
again). Every regrade is recorded as a run (provider "regrade") with its settings. The report then reads
the new figures, so Table 1 can be regenerated from the same database.
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mkb.agent.feedback import n_correct
from mkb.environment import describe
from mkb.errors import MkbError
from mkb.problems import catalog_for, resolve
from mkb.records import JudgeRecord, State, Status
from mkb.settings import Settings
from mkb.store import Run, Store, StoredSubmission, Trial, now

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Regraded:
    """One trial's regrade: the final grading it had and the one it has now."""

    model: str
    trial_id: str
    before: dict
    after: dict
    applied: bool
    """False when the regrade ended in infra_error: the trial keeps its earlier result."""

    def row(self) -> dict:
        return {"model": self.model, "trial": self.trial_id, "applied": self.applied,
                **{f"{k}_before": v for k, v in self.before.items()},
                **{f"{k}_after": v for k, v in self.after.items()}}


def _figures(record: JudgeRecord | dict) -> dict:
    data = record.model_dump(mode="json") if isinstance(record, JudgeRecord) else record
    details = data.get("details") or {}
    return {"status": data.get("status"), "speedup": data.get("speedup"), "kernel_ms": data.get("kernel_ms"),
            "eager_ms": data.get("eager_ms"), "grading": (details.get("grading") or {}).get("mode", "single")}


def targets(store: Store, models: list[str] | None, problems: list[str] | None) -> list[tuple[Trial, StoredSubmission]]:
    """Finished trials of the selection, each with the last final grading of its current attempt, by problem
    (so that one problem's trials share the baseline the first of them measures)."""
    found = []
    for trial in store.trials():
        if (models and trial.model not in models) or (problems and trial.problem_id not in problems):
            continue
        if trial.state != State.FINISHED or trial.attempt_id is None:
            continue
        finals = [s for s in store.submissions(trial.attempt_id) if s.kind == "final"]
        if finals and finals[-1].kernel_source is not None:
            found.append((trial, finals[-1]))
    return sorted(found, key=lambda pair: (pair[0].problem_id, pair[0].model, pair[0].trial_id))


def regrade(settings: Settings, store: Store, grade_final: Callable[..., JudgeRecord], models: list[str] | None,
            problems: list[str] | None, run_params: dict, command: str,
            on_trial: Callable[[Regraded], None] | None = None) -> list[Regraded]:
    """Regrade the selection's final kernels with grade_final(problem, kernel_path, dsl); returns each trial's result.

    Raises:
        MkbError: nothing in the database matches the selection.
    """
    chosen = targets(store, models, problems)
    if not chosen:
        raise MkbError(f"no finished trial with a final grading in {store.path} matches the selection "
                       f"(models {', '.join(models or ['all'])}, problems {', '.join(problems or ['all'])}).")
    catalog, facts = catalog_for(settings.problems_dir), describe(with_gpu=False)
    runs = {}
    for model in sorted({t.model for t, _ in chosen}):
        runs[model] = Run(run_id=uuid.uuid4().hex, model=model, provider="regrade", params=run_params,
                          versions=facts["versions"], git_commit=facts["git_commit"], host=facts["host"],
                          command=command, started_at=now())
        store.put(runs[model])
    done = []
    with tempfile.TemporaryDirectory(prefix="mkb-regrade-") as tmp:
        for trial, final in chosen:
            path = Path(tmp) / trial.model.replace("/", "_") / trial.trial_id / "kernel.py"
            path.parent.mkdir(parents=True)
            path.write_text(final.kernel_source, encoding="utf-8")
            record = grade_final(resolve(trial.problem_id, catalog), str(path), trial.dsl)
            done.append(_apply(store, trial, final, record, runs[trial.model].run_id))
            if on_trial:
                on_trial(done[-1])
    for run in runs.values():
        store.put(run.model_copy(update={"state": State.FINISHED, "finished_at": now()}))
    return done


def _apply(store: Store, trial: Trial, final: StoredSubmission, record: JudgeRecord, run_id: str) -> Regraded:
    """Store the new final grading as the attempt's last and make it the trial's result, unless it is an infra_error."""
    before, after = _figures(final.record), _figures(record)
    if record.status == Status.INFRA_ERROR:  # the judge's failure: the trial keeps its result, nothing is stored
        log.warning("regrading %s %s ended in infra_error (%s); its result is unchanged", trial.model,
                    trial.trial_id, record.message)
        return Regraded(trial.model, trial.trial_id, before, after, applied=False)
    data = record.model_dump(mode="json")
    data["details"] = {**data.get("details", {}), "regrade": {"run_id": run_id, "replaces_submission": final.n,
                                                             "before": before}}
    n = max(s.n for s in store.submissions(trial.attempt_id)) + 1
    store.add(StoredSubmission(attempt_id=trial.attempt_id, n=n, kind="final", status=record.status,
                               speedup=record.speedup, kernel_ms=record.kernel_ms, eager_ms=record.eager_ms,
                               kernel_sha256=hashlib.sha256(final.kernel_source.encode()).hexdigest(),
                               kernel_source=final.kernel_source, queue_s=0.0, n_correct_draws=n_correct(record),
                               record=data, created_at=now()))
    store.put(trial.model_copy(update={"status": record.status, "speedup": record.speedup, "kernel_ms": record.kernel_ms,
                                       "eager_ms": record.eager_ms, "n_correct_draws": n_correct(record)}))
    return Regraded(trial.model, trial.trial_id, before, after, applied=True)
