"""The report's tables, built from scored results: Table 1, family, standing, source verdict, arms, usage, DSL share
(shares.py), cells."""

from __future__ import annotations

from mkb.analysis.data import ARM_LABELS, ARMS, DIRECTION_LABELS, DIRECTIONS, Results
from mkb.analysis.metrics import Standing
from mkb.analysis.params import footnote
from mkb.analysis.render import Column, Table
from mkb.analysis.summaries import model_groups, select, summarize_arm, summarize_cells
from mkb.records import FAMILIES, Arm, State

_PAIRED = (Column("cells", "Cells", "int"), Column("dgm", "ΔGM [95% CI]", "signed_pct_ci"),
           Column("help", "Help T [95% CI]", "pct_ci"), Column("harm", "Harm H [95% CI]", "pct_ci"),
           Column("neutral", "Neutral", "pct"))


def _arms_of(direction: str) -> tuple[Arm, Arm, Arm]:
    skill = Arm(f"{direction}_skill")
    base = next(a for a in ARMS if not a.is_skill and a.dsl == skill.dsl)
    return skill.source, base, skill


def _exclusion_notes(results: Results) -> tuple[str, ...]:
    excluded = [a for a in results.attempts if not a.counted]
    incomplete = [c for c in results.cells if not c.complete]
    skipped = [a for a in results.attempts if a.skipped]
    notes = [f"{len(results.complete_cells)} complete cells; {len(skipped)} skill trials skipped "
             f"(no SKILL.md from the source) are scored r = 1."]
    if excluded:
        states = sorted({a.status if a.state == State.FINISHED else a.state for a in excluded})
        notes.append(f"{len(excluded)} trials not counted ({', '.join(states)}); never charged to the model.")
    if incomplete:
        notes.append(f"{len(incomplete)} cells incomplete (base or skill trial missing or not counted); "
                     f"listed in cells.csv, left out of paired statistics.")
    if any(m.is_oracle for m in results.models):
        notes.append("(oracle) = the built-in reference agent submitting validated solutions; "
                     "an upper bound, not a model, and never pooled into 'all models'. Both arms of an "
                     "oracle cell submit the identical kernel, so its help and harm rates measure the "
                     "judge's timing noise, not transfer.")
    return tuple(notes)


_FLOOR = (Column("help_floor", "Help T at floor [95% CI]", "pct_ci"),
          Column("harm_floor", "Harm H at floor [95% CI]", "pct_ci"))


def _floor_note(results: Results) -> str:
    """Which threshold each help/harm column uses (Table 1 and its device-time appendix)."""
    delta = f"the paper's delta = {results.params.delta:g}"
    if not results.floors:
        return (f"Help T and Harm H judge each cell at {delta}. No noise floors are recorded: run mkb calibrate "
                f"to add help and harm at max(delta, each problem's measured floor).")
    floors = ", ".join(f"{p} {100 * f:.1f}%" for p, f in sorted(results.floors.items()))
    return (f"Help T and Harm H judge each cell at {delta}; the 'at floor' columns at max(delta, the floor of "
            f"the cell's problem): the largest spread of repeated final gradings of its variants (mkb calibrate: "
            f"{floors}); problems without a floor use delta.")


def _main_rows(results: Results, cells_of) -> list[dict]:
    rows = []
    for label, is_model in model_groups(results):
        for direction in DIRECTIONS:
            cells = select(cells_of, model=is_model, direction=direction)
            if not cells:
                continue
            source, base, skill = _arms_of(direction)
            row = {"model": label, "direction": DIRECTION_LABELS[direction]}
            row |= summarize_cells(cells, results.params, f"main/{label}/{direction}").as_row()
            for role, arm in (("source", source), ("base", base), ("skill", skill)):
                row[f"pass_{role}"] = summarize_arm(select(results.attempts, model=is_model, arm=arm),
                                                    results.params).passed
            rows.append(row)
    return rows


def table_main(results: Results) -> Table:
    """Table 1: per model and direction, paired statistics (at delta, and at the noise floor when one is
    recorded) and pass rates of the three arms."""
    columns = (Column("model", "Model"), Column("direction", "Direction"), *_PAIRED,
               *(_FLOOR if results.floors else ()),
               Column("pass_source", "Pass source", "pct"), Column("pass_base", "Pass base", "pct"),
               Column("pass_skill", "Pass skill", "pct"))
    return Table("table1_main", "Table 1: skill vs base by model and direction", columns,
                 tuple(_main_rows(results, results.cells)), _exclusion_notes(results) + (
                     "Pass rates are over all attempts of the arm (source = solo in the source DSL, "
                     "base = solo in the target DSL, skill = the skill-conditioned target attempt).",
                     _floor_note(results)),
                 footnote(results.params))


def table_device_time(results: Results) -> Table:
    """Appendix: Table 1 recomputed with device time (profiler), so a reader sees whether conclusions depend on
    the host."""
    scored = [c for c in results.device_cells if c.complete]
    lost = sum(1 for c in results.cells if c.complete) - len(scored)
    columns = (Column("model", "Model"), Column("direction", "Direction"), *_PAIRED,
               *(_FLOOR if results.floors else ()))
    notes = (f"Speedup on the device clock: the eager reference's device time per call over the kernel's "
             f"(profiler, medians over a final grading's processes), in place of the timed window, which holds "
             f"the host's launch path and synchronisation. {len(scored)} complete cells; {lost} cells of Table 1 "
             f"are left out because a grading of theirs recorded no device time of the eager reference "
             f"(graded before issue #27: mkb regrade adds it).", _floor_note(results))
    rows = [r for r in _main_rows(results, scored) if r["cells"]]
    return Table("table8_device_time", "Appendix: Table 1 with device time (profiler)", columns, tuple(rows),
                 notes, footnote(results.params))


def table_family(results: Results) -> Table:
    """Paired statistics per model, direction and problem family."""
    families = [f for f in FAMILIES if any(c.family == f for c in results.cells)]
    families += sorted({c.family for c in results.cells} - set(FAMILIES))
    rows = []
    for label, is_model in model_groups(results):
        for direction in DIRECTIONS:
            for family in families:
                cells = select(results.cells, model=is_model, direction=direction, family=family)
                if any(c.complete for c in cells):
                    rows.append({"model": label, "direction": DIRECTION_LABELS[direction], "family": family}
                                | summarize_cells(cells, results.params,
                                                  f"family/{label}/{direction}/{family}").as_row())
    columns = (Column("model", "Model"), Column("direction", "Direction"), Column("family", "Family"), *_PAIRED)
    return Table("table2_family", "Skill vs base by problem family", columns, tuple(rows),
                 _exclusion_notes(results), footnote(results.params))


def table_standing(results: Results) -> Table:
    """Outcomes by relative standing of the source (source tier vs base tier), directions pooled."""
    rows = []
    for label, is_model in model_groups(results):
        cells = [c for c in select(results.cells, model=is_model) if c.standing is not None]
        for group in Standing:
            members = [c for c in cells if c.standing == group]
            if members:
                rows.append({"model": label, "standing": str(group), "share": len(members) / len(cells)}
                            | summarize_cells(members, results.params, f"standing/{label}/{group}").as_row())
    columns = (Column("model", "Model"), Column("standing", "Source vs base"),
               Column("share", "Share of cells", "pct"), *_PAIRED)
    return Table("table3_standing", "Outcomes by relative standing of the source (both directions)",
                 columns, tuple(rows), _exclusion_notes(results) + (
                     "above: source tier > base tier; same: equal; below: source tier < base tier. "
                     "Cells whose source trial is not counted have no standing.",),
                 footnote(results.params))


def table_source_verdict(results: Results) -> Table:
    """Paired statistics by whether the source solo passed."""
    rows = []
    for label, is_model in model_groups(results):
        for direction in DIRECTIONS:
            for verdict in ("passed", "failed"):
                cells = select(results.cells, model=is_model, direction=direction, source_verdict=verdict)
                if any(c.complete for c in cells):
                    rows.append({"model": label, "direction": DIRECTION_LABELS[direction], "source": verdict}
                                | summarize_cells(cells, results.params,
                                                  f"verdict/{label}/{direction}/{verdict}").as_row())
    columns = (Column("model", "Model"), Column("direction", "Direction"), Column("source", "Source solo"),
               *_PAIRED)
    return Table("table4_source_verdict", "Skill vs base by source verdict", columns, tuple(rows),
                 _exclusion_notes(results), footnote(results.params))


def ladder_key(threshold: float) -> str:
    """The column of R@t, named by its threshold: r_at_0, r_at_0.5, r_at_1, ..."""
    return f"r_at_{threshold:g}"


def table_arms(results: Results) -> Table:
    """Ladder per model and arm: pass rate, R@t, score S, median speedup of passed attempts."""
    thresholds = results.params.thresholds
    rows = []
    for label, is_model in model_groups(results):
        for arm in ARMS:
            trials = select(results.attempts, model=is_model, arm=arm)
            if not trials:
                continue
            s = summarize_arm(trials, results.params)
            row = {"model": label, "arm": ARM_LABELS[arm], "attempts": s.attempts, "skipped": s.skipped,
                   "excluded": s.excluded, "score": s.score, "median_speedup": s.median_speedup}
            row |= {ladder_key(t): rate for t, rate in zip(thresholds, s.ladder)}
            rows.append(row)
    columns = (Column("model", "Model"), Column("arm", "Arm"), Column("attempts", "Attempts", "int"),
               Column("skipped", "Skipped", "int"), Column("excluded", "Not counted", "int"),
               *(Column(ladder_key(t), f"R@{t:g}", "pct") for t in thresholds),
               Column("score", "S", "num"), Column("median_speedup", "Median speedup (passed, ×)", "num"))
    return Table("table5_arms", "Pass rate and speedup ladder by model and arm", columns, tuple(rows),
                 _exclusion_notes(results) + ("R@t over attempts made (skipped skill trials are not attempts).",),
                 footnote(results.params))


def table_usage(results: Results) -> Table:
    """Tokens, cost and time per attempt, by model and arm (from the arm_usage view)."""
    labels = {m.name: m.label for m in results.models}
    rows = []
    for usage in results.usage:
        rows.append({"model": labels.get(usage["model"], usage["model"]), "arm": ARM_LABELS[Arm(usage["arm"])],
                     "attempts": usage["attempts"],
                     "prompt_ktok": None if usage["prompt_tokens_mean"] is None else usage["prompt_tokens_mean"] / 1e3,
                     "completion_ktok": None if usage["completion_tokens_mean"] is None
                     else usage["completion_tokens_mean"] / 1e3,
                     "cost_mean": usage["cost_usd_mean"], "cost_total": usage["cost_usd"],
                     "wall_min": None if usage["wall_s_mean"] is None else usage["wall_s_mean"] / 60,
                     "wall_h_total": None if usage["wall_s"] is None else usage["wall_s"] / 3600,
                     "queue_s": usage["queue_s_mean"], "submissions": usage["n_submissions_mean"]})
    order = {m.label: i for i, m in enumerate(results.models)}
    rows.sort(key=lambda r: (order.get(r["model"], len(order)), r["model"], list(ARM_LABELS.values()).index(r["arm"])))
    columns = (Column("model", "Model"), Column("arm", "Arm"), Column("attempts", "Attempts", "int"),
               Column("prompt_ktok", "Prompt ktok / attempt", "num"),
               Column("completion_ktok", "Completion ktok / attempt", "num"),
               Column("cost_mean", "Cost / attempt", "usd"), Column("cost_total", "Cost total", "usd"),
               Column("wall_min", "Wall min / attempt", "num"), Column("wall_h_total", "Wall h total", "num"),
               Column("queue_s", "Judge queue s / attempt", "num"),
               Column("submissions", "Submissions / attempt", "num"))
    return Table("table6_usage", "Usage per attempt by model and arm", columns, tuple(rows),
                 ("Over attempts made (finished, not lost to infra_error); wall time excludes judge queue "
                  "time; – = not recorded.",), footnote(results.params))


def table_cells(results: Results) -> Table:
    """Every cell with its trials, tiers, paired ratio and outcome (the data behind Fig. 3)."""
    rows = [{"model": c.model_label, "problem": c.problem_id, "family": c.family,
             "direction": DIRECTION_LABELS[c.direction], "replicate": c.replicate,
             "source_trial": c.source_trial_id, "source_tier": c.source_tier, "base_tier": c.base_tier,
             "skill_tier": c.skill_tier, "v_base": c.v_base, "v_skill": c.v_skill, "skipped": c.skill_skipped,
             "r": c.r, "outcome": c.outcome, "floor_delta": c.floor_delta, "outcome_floor": c.outcome_floor,
             "r_device": d.r, "standing": c.standing, "skill_sha256": (c.skill_sha256 or "")[:12] or None}
            for c, d in zip(results.cells, results.device_cells or results.cells)]
    columns = (Column("model", "Model"), Column("problem", "Problem"), Column("family", "Family"),
               Column("direction", "Direction"), Column("replicate", "Rep", "int"),
               Column("source_trial", "Source trial"), Column("source_tier", "Source tier", "int"),
               Column("base_tier", "Base tier", "int"), Column("skill_tier", "Skill tier", "int"),
               Column("v_base", "v base", "num"), Column("v_skill", "v skill", "num"),
               Column("skipped", "Skipped"), Column("r", "r", "num"), Column("outcome", "Outcome"),
               *((Column("floor_delta", "Floor", "pct"), Column("outcome_floor", "Outcome at floor"))
                 if results.floors else ()),
               *((Column("r_device", "r (device time)", "num"),) if any(d.complete for d in results.device_cells)
                 else ()),
               Column("standing", "Standing"), Column("skill_sha256", "Skill sha256"))
    return Table("cells", "Every cell: paired ratio and outcome", columns, tuple(rows),
                 _exclusion_notes(results), footnote(results.params), formats=("md", "csv"))


def all_tables(results: Results) -> list[Table]:
    """Every table of the report, in index order."""
    from mkb.analysis.shares import table_dsl_share

    return [table_main(results), table_family(results), table_standing(results),
            table_source_verdict(results), table_arms(results), table_usage(results), table_dsl_share(results),
            table_cells(results), table_device_time(results)]
