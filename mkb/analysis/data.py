"""Results read from the store's views (views.sql) and scored with the metrics: attempts and cells."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from mkb.analysis import metrics
from mkb.analysis.params import DEFAULT, Params
from mkb.records import Arm
from mkb.store import Store

DIRECTIONS: tuple[str, ...] = ("cutedsl2tirx", "tirx2cutedsl")
"""The two transfer directions, named after their skill arm without the '_skill' suffix."""

DIRECTION_LABELS = {"cutedsl2tirx": "CuTe DSL → TIRx", "tirx2cutedsl": "TIRx → CuTe DSL"}
ARM_LABELS = {Arm.SOLO_CUTEDSL: "solo CuTe DSL", Arm.SOLO_TIRX: "solo TIRx",
              Arm.CUTEDSL2TIRX_SKILL: "CuTe→TIRx skill", Arm.TIRX2CUTEDSL_SKILL: "TIRx→CuTe skill"}
ARMS: tuple[Arm, ...] = tuple(Arm)


@dataclass(frozen=True)
class Model:
    """A model that has trials in the store."""

    name: str
    """Model id as stored in trials.model."""
    label: str
    """What tables and figures show: the name, with ' (oracle)' for the reference agent."""
    is_oracle: bool
    """The built-in reference agent (or a run flagged is_oracle): an upper bound, not a model."""


@dataclass(frozen=True)
class Attempt:
    """One trial as the metrics see it (a row of the trial_outcomes view)."""

    model: str
    model_label: str
    is_oracle: bool
    trial_id: str
    problem_id: str
    family: str
    replicate: int
    arm: str
    state: str
    status: str | None
    counted: bool
    """Enters the metrics: a finished attempt not lost to infra_error, or a skipped skill trial."""
    attempted: bool
    """An attempt was made and graded (counted and not skipped)."""
    skipped: bool
    passed: bool
    speedup: float
    """eager_ms / kernel_ms if passed, else 0."""
    prompt_tokens: int | None
    completion_tokens: int | None
    cost_usd: float | None
    wall_s: float | None
    dsl_share: float | None = None
    """The final grading's DSL share of device time (trials.dsl_share); None when not recorded."""


@dataclass(frozen=True)
class Cell:
    """One (model, problem, direction, replicate) cell, scored (a row of the cells view + metrics)."""

    model: str
    model_label: str
    is_oracle: bool
    problem_id: str
    family: str
    direction: str
    replicate: int
    source_trial_id: str | None
    base_trial_id: str | None
    skill_trial_id: str | None
    source_counted: bool
    base_counted: bool
    skill_counted: bool
    skill_skipped: bool
    skill_sha256: str | None
    complete: bool
    """Base and skill are both counted: the cell has a paired ratio."""
    source_tier: int | None
    base_tier: int | None
    skill_tier: int | None
    v_base: float | None
    v_skill: float | None
    r: float | None
    """v_skill / v_base (1 if the skill trial was skipped); None unless complete."""
    outcome: str | None
    """help / neutral / harm at the paper's delta; None unless complete."""
    floor_delta: float | None
    """max(delta, the problem's noise floor from mkb calibrate); None unless complete."""
    outcome_floor: str | None
    """help / neutral / harm at floor_delta; None unless complete."""
    standing: str | None
    """above / same / below (source tier vs base tier); None unless complete with a counted source."""
    source_verdict: str | None
    """passed / failed: the source solo's final status; None if the source is not counted."""


@dataclass(frozen=True)
class Results:
    """Everything a report is built from."""

    params: Params
    models: tuple[Model, ...]
    attempts: tuple[Attempt, ...]
    """Every trial of the selected models, counted or not."""
    cells: tuple[Cell, ...]
    """Every cell with at least one trial, complete or not."""
    usage: tuple[dict, ...]
    """Rows of the arm_usage view (per model and arm)."""
    floors: dict[str, float] = field(default_factory=dict)
    """Noise floor per calibrated problem (problem_floors view, paper timing); empty when none is recorded."""
    device_cells: tuple[Cell, ...] = ()
    """The cells scored again with device time (eager device ms / kernel device ms, profiler), for the report's
    appendix; a cell whose base or skill grading lacks device times is incomplete there."""

    @property
    def counted(self) -> tuple[Attempt, ...]:
        return tuple(a for a in self.attempts if a.counted)

    @property
    def complete_cells(self) -> tuple[Cell, ...]:
        return tuple(c for c in self.cells if c.complete)

    @property
    def is_empty(self) -> bool:
        return not self.counted


def _tier(passed: bool | None, speedup: float | None, counted: bool, params: Params) -> int | None:
    return metrics.tier(bool(passed), speedup or 0.0, params.thresholds) if counted else None


def _value(passed: bool | None, speedup: float | None, params: Params) -> float:
    return metrics.attempt_value(bool(passed), speedup or 0.0, params.clip_low, params.clip_high,
                                 params.fail_value)


def score_cell(row: dict, params: Params = DEFAULT, floor: float | None = None) -> Cell:
    """Score one row of the cells view: tiers, values, paired ratio, outcome (at delta and at max(delta, floor)),
    standing."""
    source_tier = _tier(row["source_passed"], row["source_speedup"], row["source_counted"], params)
    base_tier = _tier(row["base_passed"], row["base_speedup"], row["base_counted"], params)
    skill_tier = None if row["skill_skipped"] else _tier(row["skill_passed"], row["skill_speedup"],
                                                         row["skill_counted"], params)
    v_base = _value(row["base_passed"], row["base_speedup"], params) if row["base_counted"] else None
    v_skill = (_value(row["skill_passed"], row["skill_speedup"], params)
               if row["skill_counted"] and not row["skill_skipped"] else None)
    r = outcome = standing = floor_delta = outcome_floor = None
    if row["complete"]:
        r = metrics.paired_ratio(math.nan if v_skill is None else v_skill, v_base, row["skill_skipped"])
        outcome = str(metrics.outcome(r, params.delta))
        floor_delta = metrics.floor_delta(params.delta, floor)
        outcome_floor = str(metrics.outcome(r, floor_delta))
        if source_tier is not None:
            standing = str(metrics.standing(source_tier, base_tier))
    names = {f.name for f in fields(Cell)}
    return Cell(**{k: v for k, v in row.items() if k in names},
                source_tier=source_tier, base_tier=base_tier, skill_tier=skill_tier, v_base=v_base,
                v_skill=v_skill, r=r, outcome=outcome, floor_delta=floor_delta, outcome_floor=outcome_floor,
                standing=standing,
                source_verdict=(("passed" if row["source_passed"] else "failed")
                                if row["source_counted"] else None))


def available_models(store: Store) -> list[Model]:
    """Models with trials in the store: real models by name, then oracles."""
    rows = store.rows("SELECT model, label, is_oracle FROM model_labels "
                      "WHERE model IN (SELECT model FROM trials) ORDER BY is_oracle, model")
    return [Model(r["model"], r["label"], bool(r["is_oracle"])) for r in rows]


def _where(models: list[str] | None) -> tuple[str, list]:
    if models is None:
        return "", []
    if not models:
        return "WHERE false", []
    return f"WHERE model IN ({', '.join('?' * len(models))})", list(models)


def load_results(store: Store, models: list[str] | None = None, params: Params = DEFAULT) -> Results:
    """Read the views for the selected models (None: all) and score every cell, on the wall clock and on the
    device clock (the appendix)."""
    selected = [m for m in available_models(store) if models is None or m.name in models]
    where, args = _where(models)
    attempt_names = {f.name for f in fields(Attempt)}
    attempts = tuple(
        Attempt(**{k: v for k, v in row.items() if k in attempt_names})
        for row in store.rows(f"SELECT * FROM trial_outcomes {where} ORDER BY model, problem_id, "
                              f"replicate, arm", args))
    floors = {r["problem_id"]: float(r["floor"]) for r in store.rows(
        "SELECT problem_id, floor FROM problem_floors WHERE timing = 'paper' ORDER BY problem_id")}
    rows = store.rows(f"SELECT * FROM cells {where} ORDER BY model, problem_id, direction, replicate", args)
    cells = tuple(score_cell(row, params, floors.get(row["problem_id"])) for row in rows)
    device = {(r["model"], r["trial_id"]): r["device_speedup"] for r in store.rows(
        f"SELECT model, trial_id, device_speedup FROM final_gradings {where}", args)}
    device_cells = tuple(score_cell(on_device(row, device), params, floors.get(row["problem_id"])) for row in rows)
    usage = tuple(store.rows(f"SELECT * FROM arm_usage {where} ORDER BY model, arm", args))
    return Results(params=params, models=tuple(selected), attempts=attempts, cells=cells, usage=usage,
                   floors=floors, device_cells=device_cells)


def on_device(row: dict, device_speedups: dict[tuple[str, str], float | None]) -> dict:
    """A cells-view row with each passed trial's speedup replaced by its device-time speedup; a passed trial
    without one is not counted (its cell is then incomplete)."""
    row = dict(row)
    for role in ("source", "base", "skill"):
        if row[f"{role}_counted"] and row[f"{role}_passed"]:
            speedup = device_speedups.get((row["model"], row[f"{role}_trial_id"]))
            row[f"{role}_speedup"] = speedup
            row[f"{role}_counted"] = speedup is not None
    row["complete"] = row["base_counted"] and row["skill_counted"]
    return row
