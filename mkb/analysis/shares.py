"""The DSL share of the graded kernels (issue #24): its distribution per model and arm, and DSL-dominant passes.

The share is the declared DSL's part of solve()'s profiled device time in an attempt's final grading
(the record's details.dsl_share, stored in trials.dsl_share). The paper's policy records it without
enforcing it, so this table says how much of what passed was the DSL's work; a pass is DSL-dominant
when its share is at least DOMINANT (the strict policy's default floor).
"""

from __future__ import annotations

import statistics

from mkb.analysis.data import ARM_LABELS, ARMS, Results
from mkb.analysis.params import footnote
from mkb.analysis.render import Column, Table
from mkb.analysis.summaries import model_groups, select

DOMINANT = 0.9
"""A pass whose DSL share is at least this is DSL-dominant (the strict policy's floor, judge/referee/policy.py)."""


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """(first quartile, median, third quartile); with one value, that value three times."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, median, q3


def table_dsl_share(results: Results) -> Table:
    """Per model and arm: passes, how many recorded a share, its quartiles and range, DSL-dominant passes."""
    rows = []
    for label, is_model in model_groups(results):
        for arm in ARMS:
            passes = select(results.attempts, model=is_model, arm=arm, passed=True)
            if not select(results.attempts, model=is_model, arm=arm):
                continue
            shares = sorted(a.dsl_share for a in passes if a.dsl_share is not None)
            row = {"model": label, "arm": ARM_LABELS[arm], "passes": len(passes), "with_share": len(shares)}
            if shares:
                q1, median, q3 = quartiles(shares)
                dominant = sum(s >= DOMINANT for s in shares)
                row |= {"min": shares[0], "q1": q1, "median": median, "q3": q3, "max": shares[-1],
                        "dominant": dominant, "dominant_share": dominant / len(shares)}
            rows.append(row)
    columns = (Column("model", "Model"), Column("arm", "Arm"), Column("passes", "Passes", "int"),
               Column("with_share", "With share", "int"), Column("min", "Min", "pct"), Column("q1", "Q1", "pct"),
               Column("median", "Median", "pct"), Column("q3", "Q3", "pct"), Column("max", "Max", "pct"),
               Column("dominant", f"DSL-dominant (≥ {DOMINANT:.0%})", "int"),
               Column("dominant_share", "DSL-dominant / with share", "pct"))
    return Table("table7_dsl_share", "The declared DSL's share of device time in passed attempts", columns,
                 tuple(rows),
                 ("DSL share: the declared DSL's kernels' share of solve()'s profiled device time per call in the "
                  "final grading (details.dsl_share); recorded under both DSL policies, enforced only under strict. "
                  "Gradings without a share (before it was recorded, or on CPU) count in Passes only.",),
                 footnote(results.params))
