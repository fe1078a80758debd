"""Every analysis parameter, defined once (DESIGN §9), and its footnote for every table."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Params:
    """The numbers the metrics depend on; printed under every table and figure."""

    thresholds: tuple[float, ...] = (0.0, 0.5, 1.0, 2.0, 4.0)
    """Ladder thresholds t: R@t = share of attempts passed with speedup >= t; tier = count attained."""
    clip_low: float = 1 / 16
    """Lower clip bound of a passed attempt's value (a passed kernel is worth at least this)."""
    clip_high: float = 16.0
    """Upper clip bound of a passed attempt's value (one outlier cannot dominate a geomean)."""
    fail_value: float = 1 / 32
    """Value of a failed attempt: below every passed one."""
    delta: float = 0.05
    """Noise floor: help if r > 1 + delta, harm if r < 1 / (1 + delta), else neutral."""
    bootstrap_samples: int = 2000
    """Bootstrap resamples of problems (paired: all cells of a problem move together)."""
    bootstrap_seed: int = 20260101
    """Base seed; each group draws from its own stream seeded by (seed, crc32(group key))."""
    confidence: float = 0.95
    """Coverage of the percentile bootstrap intervals."""

    def __post_init__(self) -> None:
        if not 0 < self.fail_value < self.clip_low < self.clip_high:
            raise ValueError("need 0 < fail_value < clip_low < clip_high")
        if self.delta < 0 or not 0 < self.confidence < 1 or self.bootstrap_samples < 1:
            raise ValueError("need delta >= 0, 0 < confidence < 1, bootstrap_samples >= 1")
        if list(self.thresholds) != sorted(self.thresholds):
            raise ValueError("thresholds must be increasing")

    def as_dict(self) -> dict:
        """The parameters as plain data (params.json of a report)."""
        return asdict(self) | {"thresholds": list(self.thresholds)}


DEFAULT = Params()


def _num(x: float) -> str:
    inverse = 1 / x
    return f"1/{round(inverse)}" if x < 1 and inverse == round(inverse) else f"{x:g}"


def footnote(params: Params = DEFAULT) -> str:
    """One paragraph stating every parameter and definition the numbers above it depend on."""
    ts = ", ".join(f"{t:g}" for t in params.thresholds)
    return (
        f"Attempt: passed, speedup = eager_ms / kernel_ms (0 if not passed); R@t = share passed with "
        f"speedup >= t for t in {{{ts}}}; S = 100 * mean_t R@t; tier = thresholds attained (0-"
        f"{len(params.thresholds)}). Value v = clip(speedup, {_num(params.clip_low)}, "
        f"{_num(params.clip_high)}) if passed else {_num(params.fail_value)}. Cell (problem, direction, "
        f"replicate): r = v_skill / v_base, r = 1 when the source wrote no skill (skipped). "
        f"dGM = geomean(r) - 1. Help T: r > 1 + delta; harm H: r < 1/(1 + delta); delta = "
        f"{params.delta:g}. Standing: source tier vs base tier. Trials ending in infra_error, "
        f"interrupted or running are excluded. Intervals: {params.confidence:.0%} percentile bootstrap "
        f"over problems (paired), B = {params.bootstrap_samples}, seed {params.bootstrap_seed}."
    )
