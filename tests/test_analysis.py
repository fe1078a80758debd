"""Metrics (DESIGN §9) against hand-computed values: pure functions, then a real database with known outcomes."""

from __future__ import annotations

import math

import pytest
from analysis_db import add_cell_trials, add_problem, add_run, build_known

from mkb.analysis import metrics
from mkb.analysis.data import available_models, load_results
from mkb.analysis.metrics import Outcome, Standing
from mkb.analysis.params import DEFAULT, Params, footnote
from mkb.analysis.summaries import POOLED_LABEL, model_groups, select, summarize_arm, summarize_cells
from mkb.analysis.tables import all_tables, table_main, table_standing
from mkb.records import Arm
from mkb.store import Store

T = DEFAULT.thresholds
C2T, T2C = Arm.CUTEDSL2TIRX_SKILL, Arm.TIRX2CUTEDSL_SKILL
SC, ST = Arm.SOLO_CUTEDSL, Arm.SOLO_TIRX


# -- pure metric functions ------------------------------------------------------------------

def test_ladder_counts_ties_at_each_threshold_as_attained():
    attempts = [(True, 1.0), (True, 0.5), (True, 4.0), (False, 0.0), (True, 0.2)]
    assert metrics.ladder(attempts, T) == (4 / 5, 3 / 5, 2 / 5, 1 / 5, 1 / 5)
    assert metrics.ladder_score(metrics.ladder(attempts, T)) == pytest.approx(100 * (0.8 + 0.6 + 0.4 + 0.2 + 0.2) / 5)


def test_ladder_of_nothing_is_nan():
    assert all(math.isnan(r) for r in metrics.ladder([], T))


@pytest.mark.parametrize(("passed", "speedup", "tier"), [
    (False, 3.0, 0), (True, 0.0, 1), (True, 0.49, 1), (True, 0.5, 2), (True, 0.99, 2), (True, 1.0, 3),
    (True, 2.0, 4), (True, 3.99, 4), (True, 4.0, 5), (True, 100.0, 5)])
def test_tier_counts_thresholds_attained(passed, speedup, tier):
    assert metrics.tier(passed, speedup, T) == tier


@pytest.mark.parametrize(("passed", "speedup", "value"), [
    (True, 1.5, 1.5), (True, 100.0, 16.0), (True, 16.0, 16.0), (True, 0.01, 1 / 16), (True, 0.0, 1 / 16),
    (False, 0.0, 1 / 32), (False, 5.0, 1 / 32)])
def test_attempt_value_clips_passed_and_floors_failed(passed, speedup, value):
    assert metrics.attempt_value(passed, speedup, 1 / 16, 16, 1 / 32) == value


def test_paired_ratio_and_skipped_means_no_change():
    assert metrics.paired_ratio(2.0, 0.5) == 4.0
    assert metrics.paired_ratio(math.nan, 0.5, skipped=True) == 1.0


def test_delta_gm_is_geomean_minus_one():
    assert metrics.delta_gm([2.0, 0.5]) == pytest.approx(0.0)
    assert metrics.delta_gm([4.0, 1.0]) == pytest.approx(1.0)
    assert metrics.delta_gm([1 / 32]) == pytest.approx(1 / 32 - 1)
    assert math.isnan(metrics.delta_gm([]))


@pytest.mark.parametrize(("r", "expected"), [
    (1.05, Outcome.NEUTRAL), (1 / 1.05, Outcome.NEUTRAL), (1.0, Outcome.NEUTRAL),
    (1.0500001, Outcome.HELP), (2.0, Outcome.HELP), (0.95, Outcome.HARM), (1 / 32, Outcome.HARM)])
def test_outcome_ties_at_the_noise_floor_are_neutral(r, expected):
    assert metrics.outcome(r, 0.05) == expected


def test_outcome_rates():
    rates = metrics.outcome_rates([Outcome.HELP, Outcome.HELP, Outcome.HARM, Outcome.NEUTRAL])
    assert rates == {Outcome.HELP: 0.5, Outcome.NEUTRAL: 0.25, Outcome.HARM: 0.25}


def test_standing_compares_tiers():
    assert metrics.standing(4, 3) == Standing.ABOVE
    assert metrics.standing(2, 2) == Standing.SAME
    assert metrics.standing(0, 1) == Standing.BELOW


def test_bootstrap_two_problems_hits_the_extremes():
    # Resampling {A: r=2, B: r=0.5}: AA (p 1/4) -> dGM +1, AB (1/2) -> 0, BB (1/4) -> -0.5.
    ci = metrics.paired_bootstrap(["A", "B"], [2.0, 0.5], 0.05, 4000, [1, 2], 0.95)
    assert ci.dgm == pytest.approx((-0.5, 1.0))
    assert ci.help == (0.0, 1.0)
    assert ci.harm == (0.0, 1.0)


def test_bootstrap_moves_all_cells_of_a_problem_together():
    # One problem: every resample is that problem, so the interval collapses onto the estimate.
    ci = metrics.paired_bootstrap(["A", "A"], [2.0, 0.5], 0.05, 500, 3, 0.95)
    assert ci.dgm == pytest.approx((0.0, 0.0))
    assert ci.help == (0.5, 0.5) and ci.harm == (0.5, 0.5)


def test_bootstrap_is_deterministic_and_independent_of_input_order():
    problems, ratios = ["p1", "p2", "p3", "p4"], [1.3, 0.7, 2.0, 1.0]
    seed = metrics.group_seed(DEFAULT.bootstrap_seed, "main/m/cutedsl2tirx")
    first = metrics.paired_bootstrap(problems, ratios, 0.05, 1000, seed, 0.95)
    assert first == metrics.paired_bootstrap(problems[::-1], ratios[::-1], 0.05, 1000, seed, 0.95)
    assert first.dgm[0] <= metrics.delta_gm(ratios) <= first.dgm[1]


def test_bootstrap_of_nothing_is_nan():
    assert all(math.isnan(x) for x in metrics.paired_bootstrap([], [], 0.05, 10, 0, 0.95).dgm)


def test_params_footnote_states_every_parameter():
    text = footnote(Params(delta=0.1, bootstrap_samples=123, bootstrap_seed=99))
    for fragment in ("{0, 0.5, 1, 2, 4}", "clip(speedup, 1/16, 16)", "else 1/32", "delta = 0.1", "B = 123",
                     "seed 99", "95%", "infra_error"):
        assert fragment in text


def test_params_reject_inconsistent_bounds():
    with pytest.raises(ValueError):
        Params(fail_value=0.1)
    with pytest.raises(ValueError):
        Params(thresholds=(1.0, 0.5))


# -- a database with known outcomes ---------------------------------------------------------
#
# model "m", five problems; speedups are of passed attempts, None = failed (incorrect).
#   p01 attention: SC 2.0 (tier 4), ST 1.0 (tier 3), C2T 1.05, T2C 4.0
#       c2t: v 1.05/1 -> r = 1.05 (tie: neutral), source above; t2c: 4/2 -> r = 2 (help), source below
#   p02 attention: SC failed, ST 0.5 (tier 2), C2T skipped, T2C 32 (clipped to 16)
#       c2t: skipped -> r = 1 (neutral), source below; t2c: 16/(1/32) -> r = 512 (help), source above
#   p03 moe: SC 1.0, ST finished with judge status infra_error (not counted), C2T 1.0, T2C failed
#       c2t: no base -> incomplete; t2c: (1/32)/1 -> r = 1/32 (harm), source not counted -> no standing
#   p04 kv_cache: SC 0.25, ST still running, C2T 0.5, T2C interrupted -> both cells incomplete
#   p05 quantization: SC 1.0, ST 1.0, C2T ended in infra_error, T2C 1/1.05
#       c2t: incomplete; t2c: r = 1/1.05 (tie: neutral), source same

@pytest.fixture(scope="module")
def known(tmp_path_factory):
    path = tmp_path_factory.mktemp("known") / "known.duckdb"
    with Store(path) as store:
        build_known(store)
    with Store(path, read_only=True) as store:
        yield load_results(store)


def _cell(results, problem, direction):
    (cell,) = [c for c in results.cells if c.problem_id == problem and c.direction == direction]
    return cell


def test_cells_pair_source_base_skill_and_score_them(known):
    expected = {
        ("p01", "cutedsl2tirx"): (1.05, "neutral", "above"), ("p01", "tirx2cutedsl"): (2.0, "help", "below"),
        ("p02", "cutedsl2tirx"): (1.0, "neutral", "below"), ("p02", "tirx2cutedsl"): (512.0, "help", "above"),
        ("p03", "tirx2cutedsl"): (1 / 32, "harm", None), ("p05", "tirx2cutedsl"): (1 / 1.05, "neutral", "same")}
    for (problem, direction), (r, outcome, standing) in expected.items():
        cell = _cell(known, problem, direction)
        assert (cell.complete, cell.outcome, cell.standing) == (True, outcome, standing), (problem, direction)
        assert cell.r == pytest.approx(r)
    assert {(c.problem_id, c.direction) for c in known.cells if not c.complete} == {
        ("p03", "cutedsl2tirx"), ("p04", "cutedsl2tirx"), ("p04", "tirx2cutedsl"), ("p05", "cutedsl2tirx")}


def test_cell_values_tiers_and_verdicts(known):
    p02 = _cell(known, "p02", "tirx2cutedsl")
    assert (p02.v_base, p02.v_skill, p02.source_tier, p02.base_tier, p02.skill_tier) == (1 / 32, 16.0, 2, 0, 5)
    assert p02.source_verdict == "passed"
    skipped = _cell(known, "p02", "cutedsl2tirx")
    assert (skipped.skill_skipped, skipped.v_skill, skipped.skill_tier, skipped.source_verdict) == (True, None, None,
                                                                                                     "failed")
    assert _cell(known, "p03", "tirx2cutedsl").source_verdict is None


def test_excluded_trials_are_never_counted(known):
    not_counted = {(a.problem_id, a.arm) for a in known.attempts if not a.counted}
    assert not_counted == {("p03", "solo_tirx"), ("p04", "solo_tirx"), ("p04", "tirx2cutedsl_skill"),
                           ("p05", "cutedsl2tirx_skill")}


def test_direction_summaries_by_hand(known):
    c2t = summarize_cells(select(known.cells, direction="cutedsl2tirx"), DEFAULT, "t/c2t")
    assert (c2t.cells, c2t.problems, c2t.skipped) == (2, 2, 1)
    assert c2t.dgm == pytest.approx(math.sqrt(1.05) - 1)
    assert (c2t.help, c2t.harm, c2t.neutral) == (0.0, 0.0, 1.0)
    # Resamples: p01p01 -> +5%, p02p02 -> 0%, one of each -> sqrt(1.05) - 1.
    assert c2t.dgm_ci == pytest.approx((0.0, 0.05))
    t2c = summarize_cells(select(known.cells, direction="tirx2cutedsl"), DEFAULT, "t/t2c")
    assert t2c.cells == 4
    assert t2c.dgm == pytest.approx((2 * 512 * (1 / 32) * (1 / 1.05)) ** 0.25 - 1)
    assert (t2c.help, t2c.harm, t2c.neutral) == (0.5, 0.25, 0.25)
    assert t2c.help_ci[0] <= 0.5 <= t2c.help_ci[1]


def test_arm_ladders_by_hand(known):
    def arm(a):
        return summarize_arm(select(known.attempts, arm=a), DEFAULT)

    sc, st, c2t, t2c = arm(SC), arm(ST), arm(C2T), arm(T2C)
    assert (sc.attempts, sc.passed, sc.ladder) == (5, 0.8, (0.8, 0.6, 0.6, 0.2, 0.0))
    assert sc.score == pytest.approx(44.0)
    assert (st.attempts, st.excluded, st.ladder) == (3, 2, (1.0, 1.0, 2 / 3, 0.0, 0.0))
    assert st.score == pytest.approx(100 * (8 / 3) / 5)
    assert (c2t.attempts, c2t.skipped, c2t.excluded, c2t.passed) == (3, 1, 1, 1.0)
    assert t2c.ladder == (0.75, 0.75, 0.5, 0.5, 0.5)  # 4.0 reaches the top rung exactly
    assert t2c.score == pytest.approx(60.0)


def test_table1_row_values(known):
    rows = {r["direction"]: r for r in table_main(known).rows}
    c2t = rows["CuTe DSL → TIRx"]
    assert (c2t["model"], c2t["cells"], c2t["pass_source"], c2t["pass_base"], c2t["pass_skill"]) == ("m", 2, 0.8, 1.0,
                                                                                                      1.0)
    assert rows["TIRx → CuTe DSL"]["pass_skill"] == 0.75


def test_standing_table_pools_directions(known):
    rows = {r["standing"]: r for r in table_standing(known).rows}
    assert {k: (r["cells"], r["help"], r["harm"]) for k, r in rows.items()} == {
        "above": (2, 0.5, 0.0), "same": (1, 0.0, 0.0), "below": (2, 0.5, 0.0)}
    assert rows["above"]["share"] == pytest.approx(0.4)


def test_family_and_verdict_tables_group_correctly(known):
    tables = {t.name: t for t in all_tables(known)}
    family = {(r["direction"], r["family"]): r["cells"] for r in tables["table2_family"].rows}
    assert family == {("CuTe DSL → TIRx", "attention"): 2, ("TIRx → CuTe DSL", "attention"): 2,
                      ("TIRx → CuTe DSL", "moe"): 1, ("TIRx → CuTe DSL", "quantization"): 1}
    verdict = {(r["direction"], r["source"]): r["cells"] for r in tables["table4_source_verdict"].rows}
    assert verdict == {("CuTe DSL → TIRx", "passed"): 1, ("CuTe DSL → TIRx", "failed"): 1,
                       ("TIRx → CuTe DSL", "passed"): 3}


def test_usage_comes_from_the_view(known):
    usage = {r["arm"]: r for r in known.usage}
    assert usage["solo_cutedsl"]["attempts"] == 5
    assert usage["solo_cutedsl"]["cost_usd"] == pytest.approx(4 * 0.5)  # the failed attempt recorded no usage
    assert usage["cutedsl2tirx_skill"]["attempts"] == 3


def test_every_table_carries_the_parameter_footnote(known):
    for table in all_tables(known):
        assert table.footnote == footnote(DEFAULT)


def test_oracle_is_labelled_and_never_pooled(tmp_path):
    with Store(tmp_path / "o.duckdb") as store:
        add_problem(store, 1, "attention")
        add_run(store, "r1", "reference", is_oracle=True)
        add_run(store, "r2", "my-oracle", is_oracle=True)
        for model in ("a", "b", "reference", "my-oracle"):
            add_cell_trials(store, model, "p01", {SC: 1.0, ST: 1.0, C2T: 2.0, T2C: 0.5})
        models = available_models(store)
        assert [(m.name, m.label) for m in models] == [
            ("a", "a"), ("b", "b"), ("my-oracle", "my-oracle (oracle)"), ("reference", "reference (oracle)")]
        results = load_results(store)
        only = load_results(store, ["b", "reference"])
    assert [m.name for m in only.models] == ["b", "reference"]
    assert {a.model for a in only.attempts} == {c.model for c in only.cells} == {"b", "reference"}
    groups = dict(model_groups(results))
    assert groups[POOLED_LABEL]("a") and groups[POOLED_LABEL]("b")
    assert not groups[POOLED_LABEL]("reference") and not groups[POOLED_LABEL]("my-oracle")
    labels = [r["model"] for r in table_main(results).rows]
    assert "reference (oracle)" in labels and "reference" not in labels
    pooled = [r for r in table_main(results).rows if r["model"] == POOLED_LABEL]
    assert [r["cells"] for r in pooled] == [2, 2]


def test_an_empty_database_gives_empty_results(tmp_path):
    with Store(tmp_path / "empty.duckdb") as store:
        results = load_results(store)
    assert results.is_empty and not results.cells and not results.models


def test_the_dsl_share_table_gives_quartiles_and_dsl_dominant_passes(store):
    """Issue #24: the share's distribution per model and arm over passes, and how many passes are DSL-dominant."""
    from analysis_db import add_trial

    from mkb.analysis.shares import table_dsl_share

    add_run(store, "r1", "m")
    for number, share in enumerate((0.02, 0.5, 0.95, 1.0, None), start=1):
        add_trial(store, "m", add_problem(store, number, "mlp_norm"), Arm.SOLO_TIRX, dsl_share=share)
    add_trial(store, "m", add_problem(store, 9, "mlp_norm"), Arm.SOLO_TIRX, status="incorrect", dsl_share=0.99)
    table = table_dsl_share(load_results(store))
    (row,) = [r for r in table.rows if r["arm"] == "solo TIRx"]
    assert (row["passes"], row["with_share"], row["dominant"]) == (5, 4, 2)  # the failed attempt is not a pass
    assert (row["min"], row["max"], row["dominant_share"]) == (0.02, 1.0, 0.5)
    assert row["median"] == pytest.approx(0.725) and row["q1"] == pytest.approx(0.38)
    assert table.name in {t.name for t in all_tables(load_results(store))}


def test_migration_20_fills_the_trials_dsl_share_from_stored_final_gradings(tmp_path):
    """An old database (schema 2) gains trials.dsl_share, read from each trial's final grading record."""
    import json

    import duckdb

    from mkb.store import migrations

    path = tmp_path / "old.duckdb"
    db = duckdb.connect(str(path))
    for step in migrations.MIGRATIONS[:2]:
        step(db)
    db.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name VARCHAR, applied_at TIMESTAMP)")
    db.execute("INSERT INTO schema_migrations VALUES (1, 'm001_initial', now()), (2, 'm002', now())")
    db.execute("INSERT INTO trials (model, trial_id, attempt_id, problem_id, replicate, arm, dsl, state) VALUES "
               "('m', 'p01_r1_solo_tirx', 'a1', 'p01', 1, 'solo_tirx', 'tirx', 'finished')")
    for n, kind, share in ((1, "feedback", 0.1), (2, "final", 0.37)):
        db.execute("INSERT INTO submissions (attempt_id, n, kind, status, record, created_at) VALUES "
                   "('a1', ?, ?, 'passed', ?, now())", [n, kind, json.dumps({"details": {"dsl_share": share}})])
    db.close()
    with Store(path) as opened:
        assert opened.rows("SELECT dsl_share FROM trials") == [{"dsl_share": 0.37}]
