"""The report's figures (matplotlib, Agg; no pyplot state): Fig. 3, Fig. 4, pass/speedup, usage."""

from __future__ import annotations

import logging
import math
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FixedFormatter, FixedLocator, NullLocator

from mkb.analysis import metrics
from mkb.analysis.data import ARM_LABELS, ARMS, DIRECTION_LABELS, DIRECTIONS, Results
from mkb.analysis.metrics import Outcome, Standing
from mkb.analysis.summaries import POOLED_LABEL, model_groups, select, summarize_arm, summarize_cells

# Embedding fonts in PDFs makes fontTools log every subsetting step at INFO; that is not news.
logging.getLogger("fontTools").setLevel(logging.WARNING)

OUTCOME_COLORS = {Outcome.HELP: "#2c7bb6", Outcome.NEUTRAL: "#bdbdbd", Outcome.HARM: "#d7191c"}
ARM_COLORS = dict(zip(ARMS, ("#1b9e77", "#d95f02", "#7570b3", "#e7298a")))
ARM_MARKERS = dict(zip(ARMS, ("o", "s", "^", "D")))
RATIO_AXIS_EXP = 3
"""Fig. 3's axis runs at most from 2^-3 to 2^3: wider, the ±δ band vanishes; longer bars end there, marked."""
STYLE = {"font.size": 9, "axes.titlesize": 10, "axes.labelsize": 9, "legend.fontsize": 9,
         "axes.spines.top": False, "axes.spines.right": False, "svg.hashsalt": "mkb",
         "pdf.fonttype": 42, "path.simplify": False}


@dataclass(frozen=True)
class FigureSpec:
    """One figure of the report: file stem, caption for the index, and how to draw it."""

    name: str
    caption: str
    draw: Callable[[Results], Figure]


def _pow2_label(exponent: int) -> str:
    return f"{2 ** exponent:g}×" if exponent >= 0 else f"1/{2 ** -exponent}×"


def _log2_axis(ax, low_exp: int, high_exp: int, pad: float = 0.0) -> None:
    """Log-2 y axis from 2^(low_exp - pad) to 2^(high_exp + pad), a tick at every power (or every other)."""
    ax.set_yscale("log", base=2)
    ax.set_ylim(2.0 ** (low_exp - pad), 2.0 ** (high_exp + pad))
    step = 1 if high_exp - low_exp <= 8 else 2
    exps = [e for e in range(low_exp, high_exp + 1) if e % step == 0]
    ax.yaxis.set_major_locator(FixedLocator([2.0 ** e for e in exps]))
    ax.yaxis.set_major_formatter(FixedFormatter([_pow2_label(e) for e in exps]))
    ax.yaxis.set_minor_locator(NullLocator())


def _per_problem_ratios(cells) -> list[tuple[str, float]]:
    """Geomean of r over each problem's complete cells (its replicates), sorted by r then problem."""
    by_problem: dict[str, list[float]] = {}
    for c in cells:
        if c.complete:
            by_problem.setdefault(c.problem_id, []).append(c.r)
    pairs = [(p, metrics.delta_gm(rs) + 1) for p, rs in by_problem.items()]
    return sorted(pairs, key=lambda pr: (pr[1], pr[0]))


def draw_paired_ratios(results: Results) -> Figure:
    """Fig. 3: per-problem paired ratio r, one panel per model (rows) and direction (columns)."""
    params = results.params
    groups = [(m.label, m.name) for m in results.models]
    fig = Figure(figsize=(11, 0.9 + 2.5 * len(groups)), layout="constrained")
    axes = fig.subplots(len(groups), len(DIRECTIONS), squeeze=False, sharey=True)
    all_r = [c.r for c in results.complete_cells] or [1.0]
    bound = min(RATIO_AXIS_EXP, max(2, math.ceil(max(abs(math.log2(r)) for r in all_r))))
    low, high = 2.0 ** -bound, 2.0 ** bound
    clipped_any = False
    for row, (label, model) in enumerate(groups):
        for col, direction in enumerate(DIRECTIONS):
            ax = axes[row][col]
            cells = select(results.cells, model=model, direction=direction)
            pairs = _per_problem_ratios(cells)
            x = np.arange(len(pairs))
            ratios = [r for _, r in pairs]
            shown = [min(high, max(low, r)) for r in ratios]
            colors = [OUTCOME_COLORS[metrics.outcome(r, params.delta)] for r in ratios]
            ax.axhspan(1 / (1 + params.delta), 1 + params.delta, color="#e6e6e6", zorder=0)
            ax.bar(x, [r - 1 for r in shown], bottom=1, width=0.8, color=colors, zorder=2)
            neutral = [i for i, r in enumerate(ratios) if metrics.outcome(r, params.delta) == Outcome.NEUTRAL]
            ax.scatter(neutral, [1.0] * len(neutral), s=9, color="#888888", zorder=4, linewidths=0)
            clipped_any |= _mark_clipped(ax, ratios, low, high)
            ax.axhline(1, color="black", linewidth=0.8, zorder=3)
            _log2_axis(ax, -bound, bound, pad=0.25)
            ax.set_xlim(-0.7, max(len(pairs), 12) - 0.3)
            if pairs and len(pairs) <= 30:
                ax.set_xticks(x, [p for p, _ in pairs], rotation=90, fontsize=7)
            else:
                ax.set_xticks([])
            ax.set_title(f"{label} · {DIRECTION_LABELS[direction]}")
            s = summarize_cells(cells, params, f"main/{label}/{direction}")
            text = (f"n = {s.problems} problems\nΔGM {100 * s.dgm:+.1f}%\nT {100 * s.help:.1f}%  "
                    f"H {100 * s.harm:.1f}%") if s.cells else "no complete cells"
            ax.text(0.02, 0.96, text, transform=ax.transAxes, va="top", fontsize=8,
                    bbox={"facecolor": "white", "edgecolor": "#999999", "alpha": 0.9, "pad": 3})
            if col == 0:
                ax.set_ylabel("r = v_skill / v_base\n(log scale)")
            if row == len(groups) - 1:
                ax.set_xlabel("problems, sorted by r" + ("" if len(pairs) <= 30 else f" ({len(pairs)})"))
    handles = [Patch(color=OUTCOME_COLORS[o], label=lbl) for o, lbl in (
        (Outcome.HELP, f"help (r > {1 + params.delta:g})"),
        (Outcome.NEUTRAL, f"neutral (within ±δ, δ = {params.delta:g})"),
        (Outcome.HARM, f"harm (r < 1/{1 + params.delta:g})"))]
    if clipped_any:
        handles.append(Line2D([], [], color="black", marker="^", linestyle="none", markersize=5,
                              label=f"r beyond {_pow2_label(bound)} (▲) or {_pow2_label(-bound)} (▼): bar cut at the axis"))
    fig.legend(handles=handles, loc="outside upper center", ncols=len(handles), frameon=False)
    return fig


def _mark_clipped(ax, ratios: list[float], low: float, high: float) -> bool:
    """A triangle on each bar cut at the axis, pointing the way it goes on; True when there was one."""
    above = [i for i, r in enumerate(ratios) if r > high]
    below = [i for i, r in enumerate(ratios) if r < low]
    ax.scatter(above, [high] * len(above), marker="^", s=14, color="black", zorder=5, linewidths=0, clip_on=False)
    ax.scatter(below, [low] * len(below), marker="v", s=14, color="black", zorder=5, linewidths=0, clip_on=False)
    return bool(above or below)


def draw_standing(results: Results) -> Figure:
    """Fig. 4: help / neutral / harm shares by relative standing of the source, per model."""
    groups = model_groups(results)
    groups = groups[-1:] + groups[:-1] if groups[-1][0] == POOLED_LABEL else groups
    ncols = min(3, len(groups))
    nrows = math.ceil(len(groups) / ncols)
    width = max(3.9 * ncols, 5.6)
    fig = Figure(figsize=(width, 1.0 + 2.3 * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for i, ax in enumerate(axes.flat):
        if i >= len(groups):
            ax.set_axis_off()
            continue
        label, is_model = groups[i]
        cells = [c for c in select(results.cells, model=is_model) if c.standing is not None]
        y = np.arange(len(Standing))[::-1]
        counts = []
        for yi, group in zip(y, Standing):
            members = [Outcome(c.outcome) for c in cells if c.standing == group]
            counts.append(len(members))
            rates = metrics.outcome_rates(members)
            left = 0.0
            for o in (Outcome.HELP, Outcome.NEUTRAL, Outcome.HARM):
                share = 100 * rates[o] if members else 0.0
                ax.barh(yi, share, left=left, color=OUTCOME_COLORS[o], height=0.7)
                if share >= 9:
                    ax.text(left + share / 2, yi, f"{share:.0f}%", ha="center", va="center", fontsize=8,
                            color="white" if o != Outcome.NEUTRAL else "black")
                left += share
        ax.set_yticks(y, [f"source {g}\n(n = {n} cell{'' if n == 1 else 's'})" for g, n in zip(Standing, counts)])
        ax.set_xlim(0, 100)
        ax.set_xlabel("% of cells")
        ax.set_title(label)
    handles = [Patch(color=OUTCOME_COLORS[o], label=str(o)) for o in Outcome]
    title = "Outcome of the skill-conditioned attempt vs the base solo (source tier vs base tier)"
    fig.legend(handles=handles, loc="outside upper center", ncols=3, frameon=False,
               title=textwrap.fill(title, width=int(width * 13)))  # ~13 characters of 9 pt per inch
    return fig


def draw_pass_speedup(results: Results) -> Figure:
    """Pass rate / speedup ladder per arm (left) and speedups of passed attempts (right), per model."""
    params = results.params
    fig = Figure(figsize=(11, 0.9 + 2.6 * len(results.models)), layout="constrained")
    axes = fig.subplots(len(results.models), 2, squeeze=False)
    rungs = ["passed" if t == 0 else f"≥{t:g}×" for t in params.thresholds]
    jitter = np.random.default_rng(0)
    for row, model in enumerate(results.models):
        ladder_ax, speed_ax = axes[row]
        ticks = []
        for k, arm in enumerate(ARMS):
            s = summarize_arm(select(results.attempts, model=model.name, arm=arm), params)
            # Arms often share a ladder exactly (e.g. the oracle); a small sideways dodge keeps each visible.
            dodge = (k - (len(ARMS) - 1) / 2) * 0.06
            if s.attempts:
                ladder_ax.plot(np.arange(len(rungs)) + dodge, [100 * r for r in s.ladder], marker=ARM_MARKERS[arm],
                               markersize=5, color=ARM_COLORS[arm], label=ARM_LABELS[arm])
            speeds = [a.speedup for a in select(results.attempts, model=model.name, arm=arm)
                      if a.attempted and a.passed and a.speedup > 0]
            passed = sum(a.attempted and a.passed for a in select(results.attempts, model=model.name, arm=arm))
            # passed attempts graded without a GPU (the judge's CPU mode) have no timing to plot
            untimed = f", {passed - len(speeds)} untimed" if passed > len(speeds) else ""
            ticks.append(f"{ARM_LABELS[arm]}\n{passed} of {s.attempts} passed{untimed}")
            if speeds:
                speed_ax.scatter(k + jitter.uniform(-0.18, 0.18, len(speeds)), speeds, s=14, alpha=0.7,
                                 color=ARM_COLORS[arm], marker=ARM_MARKERS[arm], linewidths=0)
                median = float(np.median(speeds))
                speed_ax.plot([k - 0.3, k + 0.3], [median, median], color="black", linewidth=1.5)
        ladder_ax.set_xticks(range(len(rungs)), rungs)
        ladder_ax.set_ylim(-3, 103)
        ladder_ax.set_ylabel("% of attempts")
        ladder_ax.set_title(f"{model.label}: share of attempts reaching each rung")
        ladder_ax.grid(axis="y", color="#e0e0e0")
        passed = [a.speedup for a in results.attempts if a.model == model.name and a.passed and a.speedup > 0]
        low = min(-2, math.floor(math.log2(min(passed)))) if passed else -2
        high = max(2, math.ceil(math.log2(max(passed)))) if passed else 2
        _log2_axis(speed_ax, low, high, pad=0.4)
        speed_ax.axhline(1, color="#777777", linewidth=0.8, linestyle="--")
        speed_ax.set_xlim(-0.6, len(ARMS) - 0.4)
        speed_ax.set_xticks(range(len(ARMS)), ticks, fontsize=8)
        speed_ax.set_ylabel("speedup vs eager\n(×, log scale)")
        speed_ax.set_title(f"{model.label}: speedup of passed attempts (bar = median)")
    handles = [Line2D([], [], color=ARM_COLORS[a], marker=ARM_MARKERS[a], label=ARM_LABELS[a])
               for a in ARMS]
    fig.legend(handles=handles, loc="outside upper center", ncols=len(ARMS), frameon=False)
    return fig


def _tokens_k(u: dict) -> float | None:
    """Mean tokens per attempt, in thousands; None when none were recorded (0 means no model was asked: the
    oracle, or an endpoint that reports no usage)."""
    total = (u["prompt_tokens_mean"] or 0) + (u["completion_tokens_mean"] or 0)
    return total / 1e3 if total > 0 else None


def draw_usage(results: Results) -> Figure:
    """Mean tokens, cost and wall time per attempt, by model (groups) and arm (bars)."""
    labels = [m.label for m in results.models]
    by_key = {(u["model"], u["arm"]): u for u in results.usage}
    panels = (("tokens per attempt (thousands)", _tokens_k),
              ("cost per attempt (USD)", lambda u: u["cost_usd_mean"]),
              ("agent wall time per attempt (min)", lambda u: None if u["wall_s_mean"] is None
               else u["wall_s_mean"] / 60))
    fig = Figure(figsize=(12, 3.8), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    width = 0.8 / len(ARMS)
    x = np.arange(len(labels))
    for ax, (title, value) in zip(axes, panels):
        gaps: dict[int, list[tuple[float, str]]] = {}
        for k, arm in enumerate(ARMS):
            values = [by_key.get((m.name, str(arm))) for m in results.models]
            heights = [np.nan if u is None or value(u) is None else value(u) for u in values]
            offsets = x + (k - (len(ARMS) - 1) / 2) * width
            ax.bar(offsets, heights, width=width, color=ARM_COLORS[arm], label=ARM_LABELS[arm])
            for i, (u, h) in enumerate(zip(values, heights)):
                if np.isnan(h):
                    gaps.setdefault(i, []).append((offsets[i], "no attempts" if u is None else "not recorded"))
        _label_gaps(ax, gaps, narrow=len(labels) > 3)
        if len(gaps) == len(labels) and all(len(g) == len(ARMS) for g in gaps.values()):
            ax.set_ylim(0, 1)  # nothing to draw: no axis of made-up numbers, negative ones included
            ax.set_yticks([])
        else:
            ax.set_ylim(bottom=0)
        ax.set_xlim(-0.5, len(labels) - 0.5)
        ax.set_xticks(x, labels, rotation=35 if len(labels) > 3 else 0, ha="right" if len(labels) > 3 else "center",
                      rotation_mode="anchor")
        ax.set_title(title)
        ax.grid(axis="y", color="#e0e0e0")
        ax.set_axisbelow(True)
    fig.legend(handles=axes[0].get_legend_handles_labels()[0], loc="outside upper center", ncols=len(ARMS),
               frameon=False)
    return fig


def _label_gaps(ax, gaps: dict[int, list[tuple[float, str]]], narrow: bool) -> None:
    """Say why bars are missing: once across a model's group when all its arms lack the number, else per bar."""
    at_bottom = ax.get_xaxis_transform()  # x in data, y as a fraction of the axes
    for i, missing in gaps.items():
        reasons = {why for _, why in missing}
        if len(missing) == len(ARMS) and len(reasons) == 1:  # across the group, or up it where groups are narrow
            ax.text(i, 0.03, reasons.pop(), transform=at_bottom, ha="center", va="bottom", fontsize=8,
                    color="#555555", rotation=90 if narrow else 0)
            continue
        for xi, why in missing:
            ax.text(xi, 0.03, why, transform=at_bottom, rotation=90, ha="center", va="bottom", fontsize=7,
                    color="#555555")


FIGURES = (
    FigureSpec("fig3_paired_ratios", "Fig. 3. Per-problem paired ratio r = v_skill / v_base (geomean over "
               "replicates), sorted, by model (rows) and direction (columns); shaded band = ±δ; the axis stops at "
               f"{_pow2_label(-RATIO_AXIS_EXP)} and {_pow2_label(RATIO_AXIS_EXP)} at most, and longer bars end "
               "there with a triangle.",
               draw_paired_ratios),
    FigureSpec("fig4_standing", "Fig. 4. Help / neutral / harm shares by relative standing of the source "
               "(source tier vs base tier), both directions pooled.", draw_standing),
    FigureSpec("fig5_pass_speedup", "Pass rate and speedup ladder per arm (left) and speedups of passed "
               "attempts (right), by model.", draw_pass_speedup),
    FigureSpec("fig6_usage", "Mean tokens, cost and agent wall time per attempt, by model and arm; \"not recorded\" "
               "where no tokens or cost were recorded (the oracle asks no model).", draw_usage),
)


def save(fig: Figure, stem: Path) -> list[Path]:
    """Write stem.png and stem.pdf with fixed metadata, so the same results give the same bytes."""
    png, pdf = stem.with_suffix(".png"), stem.with_suffix(".pdf")
    fig.savefig(png, dpi=150, metadata={"Software": None})
    fig.savefig(pdf, metadata={"Creator": "mkb report", "Producer": None, "CreationDate": None})
    return [png, pdf]


def write_figures(results: Results, out_dir: Path) -> list[tuple[FigureSpec, list[Path]]]:
    """Draw and save every figure under out_dir; returns each spec with its files."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    with matplotlib.rc_context(STYLE):
        for spec in FIGURES:
            written.append((spec, save(spec.draw(results), out_dir / spec.name)))
    return written
