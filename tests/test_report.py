"""`mkb report`, `mkb export` and the artifact's claims, through CliRunner on databases with known outcomes."""

from __future__ import annotations

import csv
import json
import math
import random
import re
from pathlib import Path

import matplotlib
import pytest
from analysis_db import add_cell_trials, add_problem, add_run, add_skill, add_trial, build_known
from click.testing import CliRunner
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from mkb.analysis import figures
from mkb.analysis.claims import load_claims
from mkb.analysis.data import load_results
from mkb.analysis.render import Column, Table, to_latex, to_markdown
from mkb.cli import main
from mkb.records import FAMILIES, Arm
from mkb.store import Store

ROOT = Path(__file__).resolve().parent.parent
TABLES = ["table1_main", "table2_family", "table3_standing", "table4_source_verdict", "table5_arms", "table6_usage"]
FIGURES = ["fig3_paired_ratios", "fig4_standing", "fig5_pass_speedup", "fig6_usage"]
SC, ST, C2T, T2C = Arm.SOLO_CUTEDSL, Arm.SOLO_TIRX, Arm.CUTEDSL2TIRX_SKILL, Arm.TIRX2CUTEDSL_SKILL


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    """Model m with the known outcomes of test_analysis, model n, and the reference oracle; skills stored."""
    path = tmp_path_factory.mktemp("db") / "mkb.duckdb"
    with Store(path) as store:
        build_known(store, "m")
        add_problem(store, 6, "linear_attention")
        add_cell_trials(store, "n", "p01", {SC: 1.0, ST: 2.0, C2T: 1.0, T2C: 1.0})
        add_cell_trials(store, "n", "p06", {SC: None, ST: 1.5, C2T: 3.0, T2C: None})
        add_run(store, "oracle-run", "reference", is_oracle=True)
        for problem in ("p01", "p02", "p06"):
            add_cell_trials(store, "reference", problem, {SC: 1.2, ST: 1.1, C2T: 1.3, T2C: 1.0})
        for model, trial in (("m", "p03_r1_solo_cutedsl"), ("m", "p01_r1_solo_tirx"), ("m", "p03_r1_solo_tirx"),
                             ("n", "p06_r1_solo_tirx"), ("n", "p06_r1_solo_cutedsl")):
            add_skill(store, model, trial, f"Skill of {model} {trial}: tile the reduction.")
    return path


@pytest.fixture(scope="module")
def reports(db, tmp_path_factory) -> tuple[Path, Path, str]:
    """The same database reported twice, into two directories (the second without figures, for speed)."""
    first, second = tmp_path_factory.mktemp("r1"), tmp_path_factory.mktemp("r2")
    result = run("report", "--db", db, "--out", first)
    assert result.exit_code == 0, result.output
    assert run("report", "--db", db, "--out", second, "--no-figures").exit_code == 0
    return first, second, result.stdout


def _csv(path: Path) -> list[dict]:
    return list(csv.DictReader(path.open(encoding="utf-8")))


def test_report_writes_every_table_and_figure(reports):
    out, _, stdout = reports
    assert stdout.strip() == str(out / "index.md")
    for name in TABLES:
        for fmt in ("md", "csv", "tex"):
            assert (out / "tables" / f"{name}.{fmt}").stat().st_size > 0
    assert (out / "tables" / "cells.csv").is_file()
    for name in FIGURES:
        assert (out / "figures" / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
        assert (out / "figures" / f"{name}.pdf").read_bytes()[:4] == b"%PDF"
    index = (out / "index.md").read_text()
    for name in TABLES + FIGURES:
        assert name in index
    assert json.loads((out / "params.json").read_text())["delta"] == 0.05


def test_table1_csv_has_the_hand_computed_numbers(reports):
    rows = {(r["model"], r["direction"]): r for r in _csv(reports[0] / "tables" / "table1_main.csv")}
    c2t, t2c = rows[("m", "CuTe DSL → TIRx")], rows[("m", "TIRx → CuTe DSL")]
    assert float(c2t["dgm"]) == pytest.approx(math.sqrt(1.05) - 1, abs=1e-6)
    assert (c2t["cells"], c2t["help"], c2t["harm"], c2t["pass_source"], c2t["pass_base"]) == ("2", "0", "0", "0.8", "1")
    assert float(t2c["dgm"]) == pytest.approx((32 / 1.05) ** 0.25 - 1, abs=1e-6)
    assert (t2c["help"], t2c["harm"], t2c["neutral"], t2c["pass_skill"]) == ("0.5", "0.25", "0.25", "0.75")
    assert {r["model"] for r in rows.values()} == {"m", "n", "reference (oracle)", "all models"}


def test_every_table_prints_the_parameters(reports):
    for name in TABLES:
        assert "*Parameters.*" in (reports[0] / "tables" / f"{name}.md").read_text()
        assert "B = 2000" in (reports[0] / "tables" / f"{name}.tex").read_text()


def test_the_oracle_is_labelled_everywhere(reports):
    for name in TABLES:
        text = (reports[0] / "tables" / f"{name}.md").read_text()
        assert "reference (oracle)" in text
        assert not re.search(r"\| reference \|", text)


def test_same_database_gives_byte_identical_tables(reports):
    first, second, _ = reports
    files = sorted(p.relative_to(first) for p in (first / "tables").rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(second) for p in (second / "tables").rglob("*") if p.is_file())
    different = [f for f in files if (first / f).read_bytes() != (second / f).read_bytes()]
    assert different == []
    assert (first / "params.json").read_bytes() == (second / "params.json").read_bytes()


def test_same_results_give_byte_identical_figures(db, reports, tmp_path):
    with Store(db, read_only=True) as store:
        results = load_results(store)
    with matplotlib.rc_context(figures.STYLE):
        paths = figures.save(figures.draw_standing(results), tmp_path / "fig4_standing")
    for path in paths:
        assert path.read_bytes() == (reports[0] / "figures" / path.name).read_bytes()


def test_models_option_selects_models(db, tmp_path):
    result = run("report", "--db", db, "--out", tmp_path, "--models", "n,reference", "--no-figures")
    assert result.exit_code == 0, result.output
    models = {r["model"] for r in _csv(tmp_path / "tables" / "table1_main.csv")}
    assert models == {"n", "reference (oracle)"}
    assert not (tmp_path / "figures").exists()


def test_compare_claims_prints_claimed_and_reproduced(db, tmp_path):
    result = run("report", "--db", db, "--out", tmp_path, "--compare-claims", "--json", "--no-figures")
    assert result.exit_code == 0, result.output
    rows = {r["claim"]: r for r in json.loads(result.stdout)}
    assert list(rows) == [c.id for c in load_claims(ROOT / "artifact" / "claims.json")]
    lift = rows["lift_range"]
    assert (lift["claimed_low"], lift["claimed_high"]) == (-0.191, 0.293)
    assert "4 model x direction rows (all models)" == lift["basis"]
    above = rows["above_help"]
    # Real models pooled, oracle left out: m has 2 cells above (p02 t2c helped, p01 c2t neutral),
    # n has 2 (p01 t2c: 1/1; p06 t2c: both failed, 1/32 over 1/32), both neutral.
    assert above["basis"] == "4 cells with source above (all models)"
    assert above["reproduced_value"] == 0.25
    assert above["verdict"] in ("claim inside 95% CI", "claim outside 95% CI")
    assert (tmp_path / "tables" / "claims.md").is_file()


def test_claims_file_holds_the_papers_numbers():
    claims = {c.id: c for c in load_claims(ROOT / "artifact" / "claims.json")}
    assert (claims["lift_range"].low, claims["lift_range"].high) == (-0.191, 0.293)
    assert (claims["help_range"].low, claims["help_range"].high) == (0.216, 0.405)
    assert (claims["harm_range"].low, claims["harm_range"].high) == (0.162, 0.446)
    assert {k: claims[k].value for k in claims if claims[k].kind == "value"} == {
        "above_help": 0.712, "above_harm": 0.081, "same_help": 0.257, "same_harm": 0.218,
        "below_help": 0.106, "below_harm": 0.538}


def test_empty_database_is_a_one_line_error(tmp_path):
    Store(tmp_path / "empty.duckdb").close()
    result = run("report", "--db", tmp_path / "empty.duckdb", "--out", tmp_path / "r")
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1 and "no finished trials" in result.stderr
    assert "mkb run-model reference" in result.stderr


def test_missing_database_and_unknown_model_are_errors(db, tmp_path):
    result = run("report", "--db", tmp_path / "nope.duckdb")
    assert result.exit_code == 1 and "no results database" in result.stderr
    result = run("report", "--db", db, "--models", "ghost", "--no-figures", "--out", tmp_path)
    assert result.exit_code == 1 and "ghost" in result.stderr and "reference" in result.stderr


@pytest.fixture(scope="module")
def export_dir(db, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("export")
    result = run("export", "--parquet", out, "--db", db)
    assert result.exit_code == 0, result.output
    return out


def test_export_writes_every_table_and_view(export_dir):
    names = {p.stem for p in export_dir.glob("*.parquet")}
    assert {"trials", "runs", "skills", "submissions", "messages", "problems", "model_labels", "trial_outcomes",
            "cells", "arm_usage", "cell_scores"} <= names
    with Store(export_dir / "check.duckdb") as store:
        (count,), = store.query(f"SELECT count(*) FROM '{export_dir}/cell_scores.parquet' WHERE complete")[1]
        assert count == 6 + 4 + 6  # m: 6 complete cells; n: 4; reference: 6


DOC = (ROOT / "docs" / "results-schema.md").read_text()


def test_docs_example_queries_run_on_the_export(export_dir):
    queries = re.findall(r"```sql\n(.*?)```", DOC, re.S)
    assert len(queries) == 5
    with Store(export_dir / "queries.duckdb") as store:
        results = [store.rows(q.replace("'export/", f"'{export_dir}/")) for q in queries]
    harmed = results[0]
    assert [(r["model_label"], r["problem_id"], r["direction"]) for r in harmed] == [
        ("m", "p03", "tirx2cutedsl")]
    assert "tile the reduction" in harmed[0]["skill"]
    table1 = {(r["model_label"], r["direction"]): r for r in results[1]}
    assert table1[("m", "cutedsl2tirx")]["delta_gm"] == pytest.approx(math.sqrt(1.05) - 1)


def test_docs_describe_every_exported_column(export_dir):
    with Store(export_dir / "describe.duckdb") as store:
        for path in sorted(export_dir.glob("*.parquet")):
            assert f"`{path.stem}`" in DOC, f"document {path.stem} in docs/results-schema.md"
            for (column, *_rest) in store.query(f"DESCRIBE SELECT * FROM '{path}'")[1]:
                assert f"`{column}`" in DOC, f"document column {column} of {path.stem} in docs/results-schema.md"


def test_renderers_escape_their_specials():
    table = Table("t_x", "50% of a_b → c", (Column("a", "Δ|x"), Column("p", "rate", "pct")),
                  ({"a": "x_y & z", "p": 0.5}, {"a": "≥ 2×", "p": None}), ("note > 1",), "delta = 0.05")
    tex = to_latex(table)
    assert r"x\_y \& z" in tex and r"50\% of a\_b $\rightarrow$ c" in tex and r"$\Delta$|x" in tex
    assert r"$\geq$ 2$\times$" in tex and r"note \textgreater{} 1" in tex and r"\label{tab:mkb-t-x}" in tex
    md = to_markdown(table)
    assert r"| Δ\|x | rate |" in md and "| ≥ 2× | – |" in md and "*Parameters.* delta = 0.05" in md


def test_a_sparse_database_still_gives_every_table_and_figure(tmp_path):
    # One model, solo arms only, nothing passed: no complete cell anywhere, no pooled rows.
    with Store(tmp_path / "sparse.duckdb") as store:
        add_problem(store, 1, "attention")
        add_cell_trials(store, "solo-only", "p01", {SC: None, ST: "infra_error"})
    result = run("report", "--db", tmp_path / "sparse.duckdb", "--out", tmp_path / "r", "--compare-claims")
    assert result.exit_code == 0, result.output
    for name in TABLES:
        assert (tmp_path / "r" / "tables" / f"{name}.md").is_file()
    for name in FIGURES:
        assert (tmp_path / "r" / "figures" / f"{name}.png").stat().st_size > 0
    assert "no data" in (tmp_path / "r" / "tables" / "claims.md").read_text()


# -- the figures as a reader sees them, on the three shapes a results database comes in ----------------------

SHAPES = ("one-model", "oracle-only", "many-model")


def _oracle_trials(store: Store, problems: list[str], speedups: list[tuple[float, ...]]) -> None:
    """The reference oracle's trials as it records them: no tokens, no cost."""
    add_run(store, "oracle-run", "reference", is_oracle=True)
    for problem, per_arm in zip(problems, speedups):
        for arm, speedup in zip((SC, ST, C2T, T2C), per_arm):
            add_trial(store, "reference", problem, arm, speedup=speedup, prompt_tokens=0, completion_tokens=0,
                      cost_usd=None, wall_s=30.0)


def _oracle_only(store: Store) -> None:
    """The shipped database's shape: the reference oracle alone."""
    problems = [add_problem(store, n, "attention") for n in (1, 2, 3)]
    _oracle_trials(store, problems, [(1.2, 1.1, 1.3, 1.0), (2.0, 3.0, 1.0, 4.0), (1.0, 1.0, 1.0, 1.0)])


def _many_models(store: Store) -> None:
    """Six models and the oracle over six problems, ratios from 1/64 to 64."""
    rng = random.Random(3)
    problems = [add_problem(store, n, family) for n, family in enumerate(FAMILIES, 1)]
    for model in (f"provider/model-{k}" for k in range(6)):
        for problem in problems:
            add_cell_trials(store, model, problem, {arm: rng.choice((None, 2 ** rng.uniform(-6, 6))) for arm in Arm})
    _oracle_trials(store, problems, [(1.5, 1.0, 2.0, 1.0)] * len(problems))


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> dict[str, object]:
    """Results of a one-model database (ratios up to 32: clipped bars), an oracle-only one and a many-model one."""
    found = {}
    for shape, build in (("one-model", build_known), ("oracle-only", _oracle_only), ("many-model", _many_models)):
        path = tmp_path_factory.mktemp(shape) / "mkb.duckdb"
        with Store(path) as store:
            build(store)
        with Store(path, read_only=True) as store:
            found[shape] = load_results(store)
    return found


def _drawn(spec, results) -> Figure:
    with matplotlib.rc_context(figures.STYLE):
        fig = spec.draw(results)
        FigureCanvasAgg(fig).draw()
    return fig


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("spec", figures.FIGURES, ids=lambda s: s.name)
def test_nothing_drawn_in_any_figure_is_cut_off(shapes, shape, spec):
    fig = _drawn(spec, shapes[shape])
    drawn = fig.get_tightbbox(fig.canvas.get_renderer())  # inches: every visible artist, legend titles included
    width, height = fig.get_size_inches()
    assert (drawn.x0, drawn.y0) >= (-0.01, -0.01) and drawn.x1 <= width + 0.01 and drawn.y1 <= height + 0.01


@pytest.mark.parametrize("shape", SHAPES)
def test_fig3_keeps_the_delta_band_visible_and_marks_clipped_bars(shapes, shape):
    fig = _drawn(figures.FIGURES[0], shapes[shape])
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    clipped = any(c.r > 8 or c.r < 1 / 8 for c in shapes[shape].complete_cells)
    assert clipped == (shape != "oracle-only")
    for ax in fig.axes:
        low, high = ax.get_ylim()
        assert 2 ** -3.3 < low and high < 2 ** 3.3
        band = next(p for p in ax.patches if p.get_facecolor()[:3] == matplotlib.colors.to_rgb("#e6e6e6"))
        assert band.get_window_extent().height >= 4  # pixels: the ±δ band can be seen
    assert any("bar cut at the axis" in t for t in legend) == clipped
    markers = sum(len(c.get_offsets()) for ax in fig.axes for c in ax.collections if c.get_offsets().size
                  and c.get_paths()[0].vertices.shape[0] == 4)  # the triangles (neutral dots are circles)
    assert (markers > 0) == clipped


def test_fig4_with_one_panel_and_one_cell_groups(shapes):
    fig = _drawn(figures.FIGURES[1], shapes["oracle-only"])
    assert len([ax for ax in fig.axes if ax.axison]) == 1
    counts = [re.search(r"\(n = (\d+) (cells?)\)$", t.get_text()).groups() for t in fig.axes[0].get_yticklabels()]
    assert len(counts) == 3 and all((word == "cell") == (n == "1") for n, word in counts)


def test_fig6_says_not_recorded_instead_of_drawing_empty_negative_axes(shapes):
    fig = _drawn(figures.FIGURES[3], shapes["oracle-only"])
    tokens, cost, wall = fig.axes
    for ax in (tokens, cost):
        assert [t.get_text() for t in ax.texts] == ["not recorded"]
        assert ax.get_ylim() == (0, 1) and list(ax.get_yticks()) == []
    assert wall.get_ylim()[0] == 0 and len(wall.texts) == 0 and max(p.get_height() for p in wall.patches) == 0.5
    many = _drawn(figures.FIGURES[3], shapes["many-model"])
    assert all(ax.get_ylim()[0] == 0 for ax in many.axes)
    oracle_x = len(shapes["many-model"].models) - 1
    for ax in many.axes[:2]:  # the oracle's tokens and cost: said once across its group, the models' bars drawn
        across = [(t.get_text(), t.get_position()[0]) for t in ax.texts if t.get_position()[0] == round(t.get_position()[0])]
        assert across == [("not recorded", oracle_x)] and len(ax.get_yticks()) > 0


def test_table5_names_ladder_columns_by_threshold(reports):
    header = (reports[0] / "tables" / "table5_arms.csv").read_text().splitlines()[0].split(",")
    assert [c for c in header if c.startswith("r_at_")] == ["r_at_0", "r_at_0.5", "r_at_1", "r_at_2", "r_at_4"]
