"""The CLI through click's CliRunner: problems, db, settings, reproduce, help everywhere."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from mkb.cli import main
from mkb.problems import load_catalog
from mkb.settings import load_settings

CATALOG = load_catalog(load_settings().problems_dir)


def run(*args, **kw):
    return CliRunner().invoke(main, list(args), catch_exceptions=False, **kw)


def _commands(group: click.Group, prefix=()):
    for name, cmd in group.commands.items():
        yield prefix + (name,)
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, prefix + (name,))


@pytest.mark.parametrize("path", [()] + sorted(_commands(main)))
def test_every_command_has_help_with_an_example(path):
    result = run(*path, "--help")
    assert result.exit_code == 0
    assert "Usage:" in result.stdout
    if path:
        assert "Example" in result.stdout, f"mkb {' '.join(path)} --help lacks an Example block"


def test_problems_list_json_has_the_contract_fields():
    result = run("problems", "list", "--json")
    assert result.exit_code == 0
    rows = json.loads(result.stdout)
    assert [r["id"] for r in rows] == [p.id for p in CATALOG]
    first = rows[0]
    assert {"id", "number", "name", "family", "dsl_variants", "fingerprint"} <= set(first)
    assert first["dsl_variants"] == ["cutedsl", "tirx"]
    assert first["id"] == f"p{first['number']:02d}"


def test_problems_list_filters_by_family():
    family = CATALOG[0].family
    rows = json.loads(run("problems", "list", "--family", family, "--json").stdout)
    assert rows and {r["family"] for r in rows} == {family}


def test_problems_show_gives_shapes_and_sol():
    info = CATALOG[0]
    result = run("problems", "show", str(info.number), "--json")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["id"] == info.id and data["sol_bytes"] == info.sol_bytes
    assert data["inputs"]["items"] and data["outputs"]


def test_unknown_problem_is_one_line_with_a_hint():
    result = run("problems", "show", "p99")
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        f"Error: problem 'p99' not found. Run 'mkb problems list' to see the {len(CATALOG)} problems."]


def test_problems_check_smoke_cpu_records_reports(mkb_home):
    first = CATALOG[0].id
    result = run("problems", "check", first, "--record", "--json")
    assert result.exit_code == 0, result.stderr
    reports = json.loads(result.stdout)
    assert reports[0]["problem"] == first and reports[0]["ok"] is True
    rows = json.loads(run("db", "query", "SELECT problem_id, ok FROM problem_checks", "--json").stdout)
    assert rows == [{"problem_id": first, "ok": True}]


def test_problems_check_cuda_without_gpu_is_a_clear_error():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    result = run("problems", "check", CATALOG[0].id, "--device", "cuda")
    assert result.exit_code == 1
    assert "no CUDA GPU is visible" in result.stderr


def test_problems_stats_counts_families():
    rows = json.loads(run("problems", "stats", "--json").stdout)
    assert sum(r["count"] for r in rows) == len(CATALOG)


def test_problems_fidelity_writes_the_document_and_checks_it(tmp_path, monkeypatch):
    problems = tmp_path / "problems"
    (problems / "kv_cache").mkdir(parents=True)
    (problems / "fidelity").mkdir()
    source = next(p for p in CATALOG if p.id == "p23")
    (problems / "kv_cache" / Path(source.path).name).write_bytes(Path(source.path).read_bytes())
    monkeypatch.setenv("MKB_PROBLEMS_DIR", str(problems))
    stale = run("problems", "fidelity", "--check")
    assert stale.exit_code == 1 and "no row for p23" in stale.stderr
    (problems / "fidelity" / "kv_cache.toml").write_text(
        '[p23]\noriginal = "problems/kv_cache/23_x.py"\nverdict = "same"\ndiffers = ""\nwhy = ""\n')
    assert run("problems", "fidelity", "--check").exit_code == 1
    assert run("problems", "fidelity").exit_code == 0
    assert "| p23 | `mla_cache_gather_dequantize` | `23_x.py` | same |" in (tmp_path / "docs" / "fidelity.md").read_text()
    assert run("problems", "fidelity", "--check").exit_code == 0


def test_db_init_path_and_query(mkb_home, tmp_path):
    db = tmp_path / "x.duckdb"
    assert run("--db", str(db), "db", "path").stdout.strip() == str(db)
    assert run("db", "path").stdout.strip() == str(mkb_home / "mkb.duckdb")
    assert run("--db", str(db), "db", "init").exit_code == 0
    out = run("--db", str(db), "db", "query", "SELECT count(*) AS n FROM problems", "--json")
    assert json.loads(out.stdout) == [{"n": len(CATALOG)}]
    csv_out = run("--db", str(db), "db", "query", "SELECT problem_id FROM problems ORDER BY number", "--csv")
    assert csv_out.stdout.splitlines()[:2] == ["problem_id", CATALOG[0].id]


def test_db_query_errors_are_one_line(tmp_path):
    db = tmp_path / "x.duckdb"
    run("--db", str(db), "db", "init")
    bad = run("--db", str(db), "db", "query", "SELEC nonsense")
    assert bad.exit_code == 1 and bad.stderr.startswith("Error: query failed")
    corrupt = tmp_path / "corrupt.duckdb"
    corrupt.write_bytes(b"garbage" * 1000)
    result = run("--db", str(corrupt), "db", "query", "SELECT 1")
    assert result.exit_code == 1 and "not a readable mkb database" in result.stderr
    assert corrupt.read_bytes() == b"garbage" * 1000
    missing = run("--db", str(tmp_path / "none.duckdb"), "db", "query", "SELECT 1")
    assert missing.exit_code == 1 and "mkb db init" in missing.stderr


def test_settings_reflect_env_and_flags(monkeypatch, tmp_path):
    monkeypatch.setenv("MKB_JUDGE_TIMEOUT_S", "42")
    rows = json.loads(run("--db", str(tmp_path / "f.duckdb"), "settings", "--json").stdout)
    values = {r["setting"]: r["value"] for r in rows}
    assert values["judge_timeout_s"] == 42.0
    assert values["db_path"] == str(tmp_path / "f.duckdb")


def test_reproduce_on_cpu_validates_and_records(mkb_home, monkeypatch, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("GPU machines run the full-scale form")
    result = run("reproduce")
    assert result.exit_code == 0, result.stderr
    assert "none visible" in result.stderr and "skipped" in result.stderr
    expected = len(list((Path(__file__).resolve().parent.parent / "artifact/expected/tables").iterdir()))
    assert f"{expected}/{expected} tables identical" in result.stderr + result.stdout
    rows = json.loads(run("db", "query", "SELECT count(*) AS n FROM problem_checks WHERE ok", "--json").stdout)
    assert rows == [{"n": len(CATALOG)}]


def test_readme_settings_table_matches_the_schema():
    import importlib.util

    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("render_readme", root / "scripts" / "render_readme.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = (root / "README.md").read_text()
    assert module.rendered(text) == text, "README settings table is stale: run python scripts/render_readme.py"


def test_reproduce_slices_the_oracle_to_problems_with_shipped_solutions(mkb_home, tmp_path):
    """`make reproduce PROBLEMS=...` narrows the protocol step; a slice with no shipped solution says so."""
    from mkb.reproduce import _protocol_step
    from mkb.settings import load_settings
    from mkb.store import Store

    settings = load_settings()
    solved = {p.stem for p in (Path(__file__).resolve().parent.parent / "problems/solutions/cutedsl").glob("p*.py")}
    unsolved = next(f"p{n:02d}" for n in range(1, 75) if f"p{n:02d}" not in solved)
    with Store(tmp_path / "r.duckdb") as store:
        step = _protocol_step(settings, store, "reference", [unsolved])
        assert not step.ok and f"no shipped solution for {unsolved}" in step.summary and "p28" in step.summary
        unknown = _protocol_step(settings, store, "reference", ["p99"])
        assert not unknown.ok and "p99" in unknown.summary


def test_readme_layout_table_matches_the_tree():
    """Every path the layout table names exists, and every top-level entry and every part of mkb/ is named."""
    import re

    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():
        pytest.skip("not a git checkout (the Docker image holds only the parts mkb runs from): the layout is the repo's")
    text = (root / "README.md").read_text()
    table = text[text.index("## Layout"):text.index("## Commands")]
    named = {p for row in table.splitlines() if row.startswith("| `") for p in re.findall(r"`([^`]+)`", row.split("|")[1])}
    concrete = {p.rstrip("/") for p in named if "<" not in p}
    assert [p for p in concrete if not (root / p).exists()] == []
    tracked = subprocess.run(["git", "-C", str(root), "ls-files"], capture_output=True, text=True).stdout.split()
    top = {f.split("/")[0] for f in tracked if not f.startswith(".")} | {".ci/run"}
    parts = {"/".join(f.split("/")[:2]) for f in tracked if f.startswith("mkb/") and not f.endswith(("__init__.py",
                                                                                                        "__main__.py"))}
    covered = lambda path: any(path == p or path.startswith(p + "/") or p.startswith(path + "/")  # noqa: E731
                               for p in concrete)
    assert sorted(p for p in top | parts if not covered(p)) == []


@pytest.mark.parametrize("args", [["run-model", "reference", "--problems", "p28", "--arms", "solo_tirx"],
                                  ["attempt", "p28", "--dsl", "tirx", "--model", "vllm/m", "--base-url", "http://127.0.0.1:9"],
                                  ["verify", "p28", "--dsl", "tirx", "tests/kernels/valid_tirx_p28.py"],
                                  ["bench", "judge"]])
def test_the_device_setting_reaches_every_command_that_grades(args, monkeypatch, tmp_path):
    """MKB_DEVICE is a setting like any other: asking for a GPU where none is visible is one clear line."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    monkeypatch.setenv("MKB_DEVICE", "cuda")
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    result = run("--db", str(tmp_path / "d.duckdb"), *args)
    assert result.exit_code == 1
    assert "no CUDA GPU is visible" in result.stderr or "needs a CUDA GPU" in result.stderr, result.stderr
