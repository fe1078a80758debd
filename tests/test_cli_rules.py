"""Rules every command follows: --db before or after the command, comma lists, one exit rule for
infra_error (3), a model name checked before the plan, and a model retry budget that is a setting."""

from __future__ import annotations

import json
import socket
import time

import click
import pytest
from click.testing import CliRunner
from scripted_server import error

from mkb.cli import EXIT_INFRA_ERROR, main
from mkb.store import Store

NO_DATABASE = {("problems",), ("problems", "list"), ("problems", "show"), ("problems", "stats"),
               ("problems", "fidelity"), ("docs",), ("docs", "build"), ("docs", "tables"), ("bench",),
               ("bench", "judge"), ("show-instruction",)}
"""Commands that never open the results database (every other one takes --db after its name)."""


def _leaves(group: click.Group, prefix=()):
    for name, cmd in group.commands.items():
        yield prefix + (name,), cmd
        if isinstance(cmd, click.Group):
            yield from _leaves(cmd, prefix + (name,))


def invoke(*args: str, **kw):
    return CliRunner().invoke(main, list(args), **kw)


@pytest.mark.parametrize("path, cmd", sorted(_leaves(main), key=lambda x: x[0]), ids=lambda x: " ".join(x)
                         if isinstance(x, tuple) else "")
def test_every_command_that_opens_the_database_takes_db_after_its_name(path, cmd):
    has_db = any(p.name == "db" and "--db" in p.opts for p in cmd.params)
    assert has_db == (path not in NO_DATABASE), f"mkb {' '.join(path)}: --db {'missing' if not has_db else 'extra'}"


def test_db_before_and_after_the_command_is_the_same_setting(tmp_path):
    db = tmp_path / "a" / "x.duckdb"
    for args in (["--db", str(db), "db", "path"], ["db", "path", "--db", str(db)], ["db", "--db", str(db), "path"]):
        assert invoke(*args).stdout.strip() == str(db)
    made = invoke("db", "init", "--db", str(db))
    assert made.exit_code == 0 and db.exists(), made.stderr
    query = invoke("db", "query", "SELECT count(*) AS n FROM problems", "--json", "--db", str(db))
    assert json.loads(query.stdout) == [{"n": 74}]
    plan = invoke("run-model", "reference", "--problems", "p28", "--dry-run", "--db", str(db))
    assert plan.exit_code == 0 and "0 reuse, 4 run" in plan.stderr
    twice = invoke("--db", str(db), "db", "path", "--db", str(tmp_path / "other.duckdb"))
    assert twice.exit_code == 2 and "--db is given twice" in twice.stderr


@pytest.mark.parametrize("path, cmd", sorted(_leaves(main), key=lambda x: x[0]), ids=lambda x: " ".join(x)
                         if isinstance(x, tuple) else "")
def test_every_list_option_is_repeated_or_comma_separated(path, cmd):
    for param in cmd.params:
        if getattr(param, "multiple", False):
            where = f"mkb {' '.join(path)} {param.opts}"
            assert "comma_separated" in getattr(param.callback, "__qualname__", ""), where


def test_arms_and_families_are_comma_separated_like_problems(tmp_path):
    plan = invoke("run-model", "reference", "--problems", "p28,p25", "--arms", "solo_cutedsl,solo_tirx",
                  "--families", "mlp_norm,kv_cache", "--dry-run")
    assert plan.exit_code == 0, plan.stderr
    assert "0 reuse, 4 run" in plan.stderr and "(4 trials)" in plan.stderr
    repeated = invoke("run-model", "reference", "--problems", "p28", "--arms", "solo_tirx", "--arms",
                      "cutedsl2tirx_skill", "--dry-run")
    assert "(3 trials)" in repeated.stderr  # the skill arm pulls in its source solo
    bad = invoke("run-model", "reference", "--arms", "solo_cutedsl,solo_cuda", "--dry-run")
    assert bad.exit_code == 2 and "'solo_cuda' is not one of" in bad.stderr
    listed = invoke("problems", "list", "--family", "moe,kv_cache", "--json")
    assert {p["family"] for p in json.loads(listed.stdout)} == {"moe", "kv_cache"}


@pytest.mark.parametrize("dry", [[], ["--dry-run"]])
def test_a_model_name_without_provider_fails_before_the_plan(dry, tmp_path):
    result = invoke("run-model", "gpt-x", "--problems", "p28", "--db", str(tmp_path / "m.duckdb"), *dry)
    assert result.exit_code == 1 and "names no provider" in result.stderr
    assert "plan:" not in result.stderr and not (tmp_path / "m.duckdb").exists()


@pytest.mark.parametrize("command", ["attempt", "run-model"])
def test_a_trial_ended_in_infra_error_exits_3_from_attempt_and_run_model(command, llm_server, tmp_path):
    llm_server.script([error(400, "the provider refuses")] * 4)
    db = tmp_path / "infra.duckdb"
    endpoint = ["--base-url", llm_server.base_url, "--device", "cpu", "--db", str(db)]
    argv = (["attempt", "p28", "--dsl", "cutedsl", "--model", "openai/gpt-x", *endpoint] if command == "attempt" else
            ["run-model", "openai/gpt-x", "--problems", "p28", "--arms", "solo_cutedsl", "--concurrency", "1",
             *endpoint])
    result = invoke(*argv, env={"OPENAI_API_KEY": "sk-test"})
    assert result.exit_code == EXIT_INFRA_ERROR == 3, result.stderr
    assert "1 trial ended in infra_error" in " ".join(result.stderr.split())
    with Store(db, read_only=True) as store:
        assert [t.state for t in store.trials()] == ["infra_error"]


def _refused_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"  # nothing listens there: every connection is refused


def test_the_retry_budget_is_a_setting_and_each_retry_is_logged(tmp_path):
    db = tmp_path / "refused.duckdb"
    started = time.monotonic()
    result = invoke("attempt", "p28", "--dsl", "cutedsl", "--model", "vllm/x", "--base-url", _refused_url(),
                    "--device", "cpu", "--db", str(db), env={"MKB_MODEL_RETRY_S": "3"})
    took = time.monotonic() - started
    assert result.exit_code == 3, result.stderr
    log = " ".join(result.stderr.split())
    assert "APIConnectionError" in log and "retry 1 in 2.0 s" in log and "retry 2 in 1.0 s" in log
    assert "retry 3" not in log and took < 60
    with Store(db, read_only=True) as store:
        (trial,) = store.trials()
        (run,) = store.rows("SELECT params FROM runs")
    assert "gave up after 2 retries and 3 s of waiting" in trial.message
    assert json.loads(run["params"])["model"]["retry_s"] == 3.0
    shown = invoke("settings", "--json", env={"MKB_MODEL_RETRY_S": "3"})
    assert {"setting": "model_retry_s", "value": 3.0} in json.loads(shown.stdout)
    negative = invoke("settings", env={"MKB_MODEL_RETRY_S": "-1"})
    assert negative.exit_code == 1 and "model_retry_s" in negative.stderr and "Traceback" not in negative.output


def test_a_file_given_as_mkb_home_is_one_line_before_anything_runs(tmp_path):
    home = tmp_path / "home"
    home.write_text("not a directory")
    result = invoke("run-model", "reference", "--problems", "p28", "--device", "cpu", "--db", str(tmp_path / "h.db"),
                    env={"MKB_HOME": str(home)})
    assert result.exit_code == 1 and f"{home} is a file" in result.stderr and "MKB_HOME" in result.stderr
    assert not (tmp_path / "h.db").exists() and home.read_text() == "not a directory"
