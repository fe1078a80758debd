"""Group summaries: paired-ratio statistics of a set of cells and ladder statistics of an arm."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from mkb.analysis import metrics
from mkb.analysis.data import Attempt, Cell, Model, Results
from mkb.analysis.params import Params


@dataclass(frozen=True)
class CellSummary:
    """Paired-ratio statistics of one group of cells (complete cells only)."""

    cells: int
    """Complete cells in the group (each has a paired ratio)."""
    problems: int
    """Distinct problems among them (the bootstrap resamples these)."""
    skipped: int
    """Cells whose skill trial was skipped (no SKILL.md), scored r = 1."""
    dgm: float
    dgm_ci: tuple[float, float]
    help: float
    help_ci: tuple[float, float]
    harm: float
    harm_ci: tuple[float, float]
    neutral: float
    help_floor: float
    """Help rate with each cell judged at max(delta, its problem's noise floor)."""
    help_floor_ci: tuple[float, float]
    harm_floor: float
    """Harm rate with each cell judged at max(delta, its problem's noise floor)."""
    harm_floor_ci: tuple[float, float]

    def as_row(self) -> dict:
        """Flat fields for a table row: dgm, dgm_lo, dgm_hi, help, help_lo, ..."""
        row = {"cells": self.cells, "problems": self.problems, "skipped": self.skipped,
               "neutral": self.neutral}
        for name in ("dgm", "help", "harm", "help_floor", "harm_floor"):
            low, high = getattr(self, f"{name}_ci")
            row |= {name: getattr(self, name), f"{name}_lo": low, f"{name}_hi": high}
        return row


def summarize_cells(cells: Sequence[Cell], params: Params, key: str) -> CellSummary:
    """dGM, T, H, neutral share and their bootstrap intervals over the complete cells given.

    `key` names the group; it seeds the group's bootstrap stream (metrics.group_seed).
    """
    complete = [c for c in cells if c.complete]
    ratios, problem_ids = [c.r for c in complete], [c.problem_id for c in complete]
    rates = metrics.outcome_rates([metrics.Outcome(c.outcome) for c in complete])
    floor_rates = metrics.outcome_rates([metrics.Outcome(c.outcome_floor) for c in complete])
    seed = metrics.group_seed(params.bootstrap_seed, key)
    ci = metrics.paired_bootstrap(problem_ids, ratios, params.delta, params.bootstrap_samples, seed, params.confidence)
    floor_ci = metrics.paired_bootstrap(problem_ids, ratios, [c.floor_delta for c in complete],
                                        params.bootstrap_samples, seed, params.confidence)
    return CellSummary(cells=len(complete), problems=len({c.problem_id for c in complete}),
                       skipped=sum(1 for c in complete if c.skill_skipped), dgm=metrics.delta_gm(ratios),
                       dgm_ci=ci.dgm, help=rates[metrics.Outcome.HELP], help_ci=ci.help,
                       harm=rates[metrics.Outcome.HARM], harm_ci=ci.harm,
                       neutral=rates[metrics.Outcome.NEUTRAL], help_floor=floor_rates[metrics.Outcome.HELP],
                       help_floor_ci=floor_ci.help, harm_floor=floor_rates[metrics.Outcome.HARM],
                       harm_floor_ci=floor_ci.harm)


@dataclass(frozen=True)
class ArmSummary:
    """Ladder statistics of the attempts of one arm (attempts made; skipped trials are not attempts)."""

    attempts: int
    passed: float
    """Pass rate = R@0."""
    ladder: tuple[float, ...]
    """R@t for each threshold."""
    score: float
    """S = 100 * mean_t R@t."""
    median_speedup: float
    """Median speedup of the passed attempts (nan if none passed)."""
    skipped: int
    excluded: int
    """Trials of this arm not counted: infra_error, interrupted, running."""


def summarize_arm(trials: Sequence[Attempt], params: Params) -> ArmSummary:
    """Ladder, score and pass rate over the attempts made among `trials`."""
    made = [(a.passed, a.speedup) for a in trials if a.attempted]
    rates = metrics.ladder(made, params.thresholds)
    speedups = [s for passed, s in made if passed]
    return ArmSummary(attempts=len(made), passed=rates[0] if made else math.nan, ladder=rates,
                      score=metrics.ladder_score(rates), median_speedup=statistics.median(speedups)
                      if speedups else math.nan, skipped=sum(1 for a in trials if a.skipped),
                      excluded=sum(1 for a in trials if not a.counted))


def pooled_models(results: Results) -> tuple[Model, ...]:
    """The models pooled into 'all models' rows: every real model, never an oracle."""
    return tuple(m for m in results.models if not m.is_oracle)


POOLED_LABEL = "all models"
"""Label of rows that pool the real (non-oracle) models."""


def model_groups(results: Results) -> list[tuple[str, Callable[[str], bool]]]:
    """(label, model predicate) per model, plus a pooled group when there are 2+ real models."""
    groups = [(m.label, (lambda name, m=m: name == m.name)) for m in results.models]
    real = {m.name for m in pooled_models(results)}
    if len(real) > 1:
        groups.append((POOLED_LABEL, lambda name: name in real))
    return groups


def select(items: Iterable, **conditions) -> list:
    """Items whose attributes equal the given values (a value may also be a predicate)."""
    def ok(item) -> bool:
        return all(cond(getattr(item, k)) if callable(cond) else getattr(item, k) == cond
                   for k, cond in conditions.items())
    return [item for item in items if ok(item)]
