"""The metrics of DESIGN §9 as pure functions: ladder, tiers, values, paired ratios, rates, bootstrap."""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np


class Outcome(StrEnum):
    """What the skill did to one cell, judged against the noise floor delta."""

    HELP = "help"
    """r > 1 + delta: the skill-conditioned attempt beat the base solo."""
    NEUTRAL = "neutral"
    """1/(1 + delta) <= r <= 1 + delta: no change beyond timing noise (also: skipped skill)."""
    HARM = "harm"
    """r < 1/(1 + delta): the skill-conditioned attempt did worse than the base solo."""


class Standing(StrEnum):
    """Where the source solo stood relative to the base solo, by ladder tier."""

    ABOVE = "above"
    """Source tier > base tier: the skill comes from a better attempt."""
    SAME = "same"
    """Source tier == base tier."""
    BELOW = "below"
    """Source tier < base tier: the skill comes from a worse attempt."""


def ladder(attempts: Sequence[tuple[bool, float]], thresholds: Sequence[float]) -> tuple[float, ...]:
    """R@t for each threshold t: R@t = |{a : a.passed and a.speedup >= t}| / |attempts| (nan if none)."""
    if not attempts:
        return tuple(math.nan for _ in thresholds)
    return tuple(sum(1 for passed, s in attempts if passed and s >= t) / len(attempts) for t in thresholds)


def ladder_score(rates: Sequence[float]) -> float:
    """S = 100 * mean over thresholds t of R@t."""
    return 100 * sum(rates) / len(rates)


def tier(passed: bool, speedup: float, thresholds: Sequence[float]) -> int:
    """Tier = |{t : passed and speedup >= t}|: 0 = failed, 1 = passed, ..., len(thresholds) = top rung."""
    return sum(1 for t in thresholds if passed and speedup >= t)


def attempt_value(passed: bool, speedup: float, clip_low: float, clip_high: float, fail_value: float) -> float:
    """v = clip(speedup, clip_low, clip_high) if passed else fail_value."""
    return min(max(speedup, clip_low), clip_high) if passed else fail_value


def paired_ratio(v_skill: float, v_base: float, skipped: bool = False) -> float:
    """r = v_skill / v_base; r = 1 when the skill trial was skipped (no SKILL.md: no change)."""
    return 1.0 if skipped else v_skill / v_base


def delta_gm(ratios: Sequence[float]) -> float:
    """dGM = geomean(r) - 1 = exp(mean(log r)) - 1 (nan if no ratios)."""
    if not ratios:
        return math.nan
    return math.exp(sum(math.log(r) for r in ratios) / len(ratios)) - 1


def outcome(r: float, delta: float) -> Outcome:
    """help if r > 1 + delta; harm if r < 1/(1 + delta); else neutral (ties are neutral)."""
    if r > 1 + delta:
        return Outcome.HELP
    if r < 1 / (1 + delta):
        return Outcome.HARM
    return Outcome.NEUTRAL


def outcome_rates(outcomes: Sequence[Outcome]) -> dict[Outcome, float]:
    """Share of cells in each outcome: T = #help / n, H = #harm / n, neutral = #neutral / n."""
    n = len(outcomes)
    return {o: (sum(1 for x in outcomes if x == o) / n if n else math.nan) for o in Outcome}


def standing(source_tier: int, base_tier: int) -> Standing:
    """above if source tier > base tier, same if equal, below if less."""
    if source_tier > base_tier:
        return Standing.ABOVE
    return Standing.SAME if source_tier == base_tier else Standing.BELOW


def group_seed(seed: int, key: str) -> list[int]:
    """The bootstrap stream of one group: [seed, crc32(key)], so a group's interval does not
    depend on which other groups are in the report."""
    return [seed, zlib.crc32(key.encode())]


@dataclass(frozen=True)
class Intervals:
    """Percentile bootstrap intervals (low, high) of dGM, help rate T and harm rate H."""

    dgm: tuple[float, float]
    help: tuple[float, float]
    harm: tuple[float, float]


NO_INTERVALS = Intervals((math.nan, math.nan), (math.nan, math.nan), (math.nan, math.nan))


def paired_bootstrap(problem_ids: Sequence[str], ratios: Sequence[float], delta: float | Sequence[float],
                     samples: int, seed: int | list[int], confidence: float) -> Intervals:
    """Percentile intervals of dGM, T and H with problems resampled with replacement.

    Resampling unit = problem: all cells of a drawn problem (every replicate, and both directions
    or several models when a group pools them) enter together, so skill and base stay paired.
    Statistic on a resample: dGM* = exp(sum log r / n) - 1, T* = #help / n, H* = #harm / n.
    Interval = the (1-c)/2 and (1+c)/2 quantiles of B resamples. delta is one threshold for every
    cell, or one per cell (max(delta, the problem's noise floor)).
    """
    if not ratios:
        return NO_INTERVALS
    deltas = list(delta) if isinstance(delta, Sequence) else [delta] * len(ratios)
    problems = sorted(set(problem_ids))
    index = {p: i for i, p in enumerate(problems)}
    log_sum, count, helped, harmed = (np.zeros(len(problems)) for _ in range(4))
    for pid, r, d in zip(problem_ids, ratios, deltas, strict=True):
        i = index[pid]
        log_sum[i] += math.log(r)
        count[i] += 1
        helped[i] += outcome(r, d) == Outcome.HELP
        harmed[i] += outcome(r, d) == Outcome.HARM
    draws = np.random.default_rng(seed).integers(0, len(problems), size=(samples, len(problems)))
    n = count[draws].sum(axis=1)
    alpha = (1 - confidence) / 2

    def interval(values: np.ndarray) -> tuple[float, float]:
        low, high = np.quantile(values, [alpha, 1 - alpha])
        return float(low), float(high)

    return Intervals(dgm=interval(np.exp(log_sum[draws].sum(axis=1) / n) - 1),
                     help=interval(helped[draws].sum(axis=1) / n),
                     harm=interval(harmed[draws].sum(axis=1) / n))


def floor_delta(delta: float, floor: float | None) -> float:
    """The threshold a cell is judged with beside the paper's: max(delta, its problem's noise floor)."""
    return delta if floor is None else max(delta, floor)
