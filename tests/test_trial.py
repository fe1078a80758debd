"""Recording trials: one writer on every path. The same scripted attempt through `mkb attempt` and `mkb run-model`
leaves the same rows; stored attempts are shown, replayed and survive kills; a golden transcript replays."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from scripted_server import Hold, call, reply

from mkb import protocol
from mkb.agent.budget import Budget
from mkb.agent.executor import bwrap_problem
from mkb.cli import main
from mkb.cli.attempt_cmd import arm_for
from mkb.problems import catalog_for, resolve
from mkb.protocol.plan import Action, PlanItem
from mkb.records import Dsl, JudgeRecord, State, Status, TrialSpec
from mkb.settings import load_settings
from mkb.store import Attempt, Run, Store
from mkb.trial import fingerprint_parts

EXPECTED_SANDBOX = "subprocess" if bwrap_problem() else "bwrap"
REPO = Path(__file__).resolve().parent.parent
P28 = resolve("p28", catalog_for(REPO / "problems"))
GOOD_KERNEL = "import torch\n\ndef solve(x, residual, weight):\n    return x\n"
SKILL = "Memory-bound row reduction: one pass over each row, keep the sum of squares in fp32.\n"
MODEL = "openai/gpt-x"
FINISH = [reply(calls=[call("finish", {})]), reply("Confirmed.", calls=[call("finish", {})])]
"""finish and its confirmation."""


def fake_grade(problem, kernel_path, dsl, device_slot="cpu") -> JudgeRecord:
    """The judge's place in the protocol: no solve -> import_error, 'WRONG' -> incorrect, else passed at 2x."""
    source = Path(kernel_path).read_text()
    base = {"problem": problem.id, "dsl": dsl, "device": "cuda"}
    if "def solve" not in source:
        return JudgeRecord(status=Status.IMPORT_ERROR, message="kernel.py defines no solve()", **base)
    if "WRONG" in source:
        return JudgeRecord(status=Status.INCORRECT, message="out[0]: max error 0.5 > allowance 0.01", **base)
    return JudgeRecord(status=Status.PASSED, kernel_ms=0.5, eager_ms=1.0, speedup=2.0, **base)


@pytest.fixture
def settings(tmp_path):
    return load_settings(home=tmp_path / "home", device="cpu")


def run_one(store, settings, llm_server, steps, *, dsl=Dsl.CUTEDSL, skill=None, grade=fake_grade, model=MODEL):
    """One trial at p28 through protocol.execute, the wiring `mkb attempt` and `mkb run-model` share."""
    llm_server.script(steps)
    request = protocol.RunRequest(model=model, base_url=llm_server.base_url, concurrency=1, command="test")
    spec = TrialSpec(problem=P28, replicate=1, arm=arm_for(dsl, skill is not None))
    protocol.execute(settings, store, request, [PlanItem(spec=spec, action=Action.RUN)], grade=grade,
                     given_skills={spec.trial_id: skill} if skill else None)
    return store.trial(model, spec.trial_id)


def test_a_trial_is_stored_with_run_attempt_messages_submissions_and_skill(store, settings, llm_server):
    trial = run_one(store, settings, llm_server, [
        reply(calls=[call("write_file", {"path": "kernel.py", "content": GOOD_KERNEL})]),
        reply(calls=[call("submit", {}), call("write_file", {"path": "SKILL.md", "content": SKILL})]),
        *FINISH,
    ])
    assert trial.trial_id == "p28_r1_solo_cutedsl" and trial.source_trial_id is None
    assert (trial.state, trial.status, trial.speedup, trial.n_submissions, trial.n_turns) == \
        (State.FINISHED, Status.PASSED, 2.0, 1, 4)
    assert 0 < trial.wall_s < 60 and trial.queue_s >= 0 and trial.message == "finish: the agent called finish"
    assert (trial.ending, trial.timed_out, trial.n_handoffs, trial.cached_tokens) == ("finish", False, 0, 0)
    assert trial.total_s >= trial.charged_s > 0 and 2340 < trial.time_left_s < 2400
    assert (trial.cost_usd, trial.cost_source) == (None, None)  # neither reported nor in the price table
    attempt = store.find_attempt(trial.trial_id)
    assert attempt.attempt_id == trial.attempt_id and attempt.sandbox == EXPECTED_SANDBOX
    assert attempt.budget["wall_s"] == 2400.0 and attempt.usage["prompt_tokens"] == 400
    assert attempt.conditions["clock"] == "paper" and attempt.conditions["manuals"] == "guide+api+examples"
    messages = store.messages(attempt.attempt_id)
    assert [m.seq for m in messages] == list(range(len(messages))) and len(messages) == 12
    assert [s.kind for s in store.submissions(attempt.attempt_id)] == ["feedback", "final"]
    skill = store.skill(MODEL, trial.trial_id)
    assert (skill.text, skill.attempt_id, skill.n_words) == (SKILL, trial.attempt_id, len(SKILL.split()))
    [run] = store.select(Run)
    assert (run.provider, run.api_key_env, run.state, run.command) == ("openai", None, State.FINISHED, "test")
    assert set(run.params) == {"model", "request", "budget", "sandbox", "image", "device", "scale", "conditions"}
    assert trial.fingerprint == fingerprint_parts(settings, TrialSpec(problem=P28, replicate=1, arm=trial.arm),
                                                  Budget(), None).sha256


def test_cost_comes_from_the_provider_else_from_the_price_table(store, settings, llm_server):
    from mkb.agent.budget import Usage
    from mkb.agent.prices import PRICES, cost

    usage = Usage(prompt_tokens=1_000_000, cached_tokens=400_000, completion_tokens=100_000)
    price = PRICES["deepseek/deepseek-chat"]
    expected = 0.6 * price.input + 0.4 * price.cached_input + 0.1 * price.output
    assert cost("deepseek/deepseek-chat", usage) == (pytest.approx(expected), f"price-table:{price.since}")
    assert cost("deepseek/deepseek-chat", usage.model_copy(update={"cost_usd": 1.25})) == (1.25, "provider")
    assert cost("vllm/unknown-model", usage) == (None, None)  # never a guess
    trial = run_one(store, settings, llm_server, [reply(calls=[call("finish", {})], cached_tokens=60),
                                                  reply(calls=[call("finish", {})], cached_tokens=90)],
                    model="deepseek/deepseek-chat")
    assert (trial.prompt_tokens, trial.cached_tokens, trial.completion_tokens) == (200, 150, 40)
    assert trial.cost_usd == pytest.approx((50 * price.input + 150 * price.cached_input + 40 * price.output) / 1e6)
    assert trial.cost_source == f"price-table:{price.since}"


def test_a_skill_attempt_is_stored_as_the_skill_arm(store, settings, llm_server):
    trial = run_one(store, settings, llm_server, FINISH, dsl=Dsl.TIRX, skill=SKILL)
    assert trial.trial_id == "p28_r1_cutedsl2tirx_skill" and trial.source_trial_id is None
    assert trial.skill_sha256 and trial.fingerprint_parts["source_skill"] == trial.skill_sha256
    assert SKILL.strip() in store.messages(trial.attempt_id)[1].content
    assert store.skill(MODEL, trial.trial_id) is None  # skill arms write no skill


def test_show_prints_a_transcript(store, settings, llm_server):
    trial = run_one(store, settings, llm_server, [
        reply("Writing a kernel.", calls=[call("write_file", {"path": "kernel.py", "content": GOOD_KERNEL})]),
        reply(calls=[call("bash", {"command": "echo hello-from-bash"})]),
        *FINISH,
    ])
    store.close()
    runner = CliRunner()
    result = runner.invoke(main, ["show", trial.trial_id, "--db", str(store.path)])
    assert result.exit_code == 0, result.output
    for text in ("Writing a kernel.", "write_file", "def solve", "hello-from-bash", "finish", "gradings", "passed"):
        assert text in result.stderr
    data = json.loads(runner.invoke(main, ["show", trial.attempt_id[:8], "--db", str(store.path), "--json"]).stdout)
    assert len(data["messages"]) == 11 and data["attempt"]["status"] == "passed"
    missing = runner.invoke(main, ["show", "p99_r1_solo_tirx", "--db", str(store.path)])
    assert missing.exit_code == 1 and "no trial or attempt 'p99_r1_solo_tirx'" in missing.stderr


def test_replay_re_executes_recorded_tool_calls_without_a_model(store, settings, llm_server):
    from mkb.protocol.replay import replay

    trial = run_one(store, settings, llm_server, [
        reply(calls=[call("write_file", {"path": "kernel.py", "content": "WRONG\ndef solve(*a): pass\n"})]),
        reply(calls=[call("submit", {})]),
        reply(calls=[call("bash", {"command": "sed -i 's/WRONG/# fixed/' kernel.py"})]),
        *FINISH,
    ])
    requests_before, graded = len(llm_server.requests), []

    def judge(problem, kernel_path, dsl, device_slot="cpu"):
        graded.append(Path(kernel_path).read_text())
        return fake_grade(problem, kernel_path, dsl)

    original, again = replay(store, settings, trial.trial_id, grade=judge)
    assert len(llm_server.requests) == requests_before  # no model involved
    assert original.attempt_id == trial.attempt_id and again.attempt_id != trial.attempt_id
    assert [s.status for s in store.submissions(again.attempt_id)] == [Status.INCORRECT, Status.PASSED]
    assert graded[-1] == "# fixed\ndef solve(*a): pass\n"
    assert again.message.startswith(f"replay of {trial.attempt_id}: finish") and again.state == State.FINISHED
    assert again.budget["wall_s"] is None and again.trial_id == trial.trial_id
    assert store.trial(MODEL, trial.trial_id) == trial  # the trial row is left alone
    assert sorted(r.provider for r in store.select(Run)) == ["openai", "replay"]


def test_missing_key_for_a_hosted_provider_is_one_clear_line(monkeypatch, mkb_home):
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    result = CliRunner().invoke(main, ["attempt", "p28", "--dsl", "cutedsl", "--model", "openrouter/qwen/qwen3-coder"])
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        "Error: OPENROUTER_API_KEY is not set. Export it, or choose another variable with --api-key-env "
        "(or point --base-url at a local server)."]
    assert not (mkb_home / "mkb.duckdb").exists()  # refused before anything was written


def test_cli_attempt_stores_a_complete_transcript(llm_server, tmp_path):
    llm_server.script([
        reply(calls=[call("write_file", {"path": "kernel.py", "content": GOOD_KERNEL})]),
        reply(calls=[call("write_file", {"path": "SKILL.md", "content": SKILL})]),
        *FINISH,
    ])
    db = tmp_path / "cli.duckdb"
    result = CliRunner().invoke(main, ["attempt", "p28", "--dsl", "cutedsl", "--model", MODEL, "--base-url",
                                       llm_server.base_url, "--device", "cpu", "--db", str(db), "--json"])
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)[0]
    assert summary["trial_id"] == "p28_r1_solo_cutedsl" and summary["state"] == "finished"
    assert summary["status"] == "incorrect"  # the real judge, CPU mode: this kernel returns its inputs
    with Store(db, read_only=True) as store:
        messages = store.messages(summary["attempt_id"])
        assert [m.role for m in messages] == ["system", "user"] + ["assistant", "tool"] * 4 + ["user"]
        assert "CPU (test mode" in messages[0].content
        [final] = store.submissions(summary["attempt_id"])
        assert (final.kind, final.status, final.record["device"]) == ("final", Status.INCORRECT, "cpu")
        trial = store.trial(MODEL, "p28_r1_solo_cutedsl")
        assert (trial.state, trial.status, trial.arm) == (State.FINISHED, Status.INCORRECT, "solo_cutedsl")
        assert store.skill(MODEL, "p28_r1_solo_cutedsl").text == SKILL
        [run] = store.select(Run)
        assert run.command.startswith("mkb attempt p28 --dsl cutedsl") and run.params["device"] == "cpu"


_DRIVER = """
import sys
from mkb import protocol
from mkb.agent.budget import Budget
from mkb.protocol.plan import Action, PlanItem
from mkb.problems import catalog_for, resolve
from mkb.records import Arm, TrialSpec
from mkb.settings import load_settings
from mkb.store import Store
settings = load_settings(device="cpu")
spec = TrialSpec(problem=resolve("p28", catalog_for(settings.problems_dir)), replicate=1, arm=Arm.SOLO_CUTEDSL)
request = protocol.RunRequest(model="openai/gpt-x", base_url=sys.argv[1], concurrency=1)
with Store(settings.db_path) as store:
    protocol.execute(settings, store, request, [PlanItem(spec=spec, action=Action.RUN)], grade=lambda *a, **k: None)
"""


@pytest.mark.parametrize("entry", ["cli", "library"])
def test_a_killed_attempt_loses_at_most_the_message_in_flight(entry, llm_server, tmp_path):
    hold = Hold(reply(calls=[call("finish", {})]), timeout_s=30)
    llm_server.script([reply("first", calls=[call("write_file", {"path": "kernel.py", "content": GOOD_KERNEL})]),
                       hold])
    db = tmp_path / "killed.duckdb"
    env = {**os.environ, "MKB_DB": str(db), "MKB_HOME": str(tmp_path / "home")}
    argv = ([sys.executable, "-m", "mkb", "attempt", "p28", "--dsl", "cutedsl", "--model", MODEL,
             "--base-url", llm_server.base_url, "--device", "cpu"] if entry == "cli"
            else [sys.executable, "-c", _DRIVER, llm_server.base_url])
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert hold.reached.wait(60), proc.stderr.read().decode()[-2000:] if proc.poll() is not None else "no request"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        hold.release()
        if proc.poll() is None:
            proc.kill()
    with Store(db, read_only=True) as store:  # as the kill left it (a write open marks it interrupted)
        [trial] = store.trials()
        attempt = store.find_attempt(trial.trial_id)
        assert attempt.state == State.RUNNING and attempt.finished_at is None and trial.state == State.RUNNING
        messages = store.messages(attempt.attempt_id)
        assert [m.role for m in messages] == ["system", "user", "assistant", "tool"]
        assert messages[2].content == "first" and "wrote" in messages[3].content
    with Store(db) as store:
        assert store.find_attempt(trial.trial_id).state == State.INTERRUPTED
        assert len(store.messages(attempt.attempt_id)) == 4


def test_cli_replay_regrades_with_the_current_judge(store, settings, llm_server):
    trial = run_one(store, settings, llm_server, [
        reply(calls=[call("write_file", {"path": "kernel.py", "content": GOOD_KERNEL})]),
        *FINISH,
    ])
    store.close()
    result = CliRunner().invoke(main, ["replay", trial.trial_id, "--device", "cpu", "--db", str(store.path), "--json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == [{"n": 1, "kind": "final", "recorded_status": "passed", "recorded_speedup": 2.0,
                                          "replay_status": "incorrect", "replay_speedup": None, "same_kernel": True}]
    assert f"replay of {trial.attempt_id}" in result.stderr


# -- the same attempt through `mkb attempt` and `mkb run-model` -----------------------------------------------

RESPONSES = [reply("kernel", [call("write_file", {"path": "kernel.py", "content": GOOD_KERNEL})]),
             reply(None, [call("submit", {})]),
             reply("skill", [call("write_file", {"path": "SKILL.md", "content": SKILL})]),
             reply("done", [call("bash", {"command": "ls"}), call("finish", {})]),
             reply("confirmed", [call("finish", {})])]


def responder(body: dict) -> dict:
    """The scripted model, by the number of replies so far: the same conversation on every path."""
    return RESPONSES[min(sum(m["role"] == "assistant" for m in body["messages"]), len(RESPONSES) - 1)]


VARIES = re.compile(r"(^|_)(id|at)$|_s$|^(seed|seeds|max_error|allowance|spare|command)$")
"""Keys whose values differ between any two runs of one attempt: ids, timestamps, durations (every *_s), the
judge's random draws (seeds and the errors measured on them), whether a judge process had been started
ahead (spare), and the command line that started the run."""
DRAWN = re.compile(r"max error \S+ > allowance \S+|\[clock: \d+m\d+s elapsed, \d+m\d+s left|graded in \d+ s"
                   r"|Finish now\? \d+m\d+s")


def _same_up_to_ids_and_times(value):
    if isinstance(value, dict):
        return {k: "<varies>" if VARIES.search(k) else _same_up_to_ids_and_times(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_same_up_to_ids_and_times(v) for v in value]
    return DRAWN.sub("<drawn>", value) if isinstance(value, str) else value


def _rows(db: Path) -> dict[str, list]:
    from mkb.store import ROWS

    with Store(db, read_only=True) as store:
        return {cls.table: [_same_up_to_ids_and_times(r.model_dump(mode="json")) for r in store.select(cls)]
                for cls in ROWS}


def test_the_same_attempt_leaves_the_same_rows_through_attempt_and_run_model(llm_server, tmp_path):
    llm_server.script([responder] * 20)
    common = ["--device", "cpu", "--base-url", llm_server.base_url]
    attempt = CliRunner().invoke(main, ["--db", str(tmp_path / "attempt.duckdb"), "attempt", "p28", "--dsl", "cutedsl",
                                        "--model", "vllm/scripted", *common])
    assert attempt.exit_code == 0, attempt.stderr
    run = CliRunner().invoke(main, ["--db", str(tmp_path / "run.duckdb"), "run-model", "vllm/scripted", "--problems",
                                    "p28", "--arms", "solo_cutedsl", *common])
    assert run.exit_code == 0, run.stderr
    by_attempt, by_run_model = _rows(tmp_path / "attempt.duckdb"), _rows(tmp_path / "run.duckdb")
    assert {table: len(rows) for table, rows in by_attempt.items()} == {
        "runs": 1, "trials": 1, "attempts": 1, "messages": 14, "submissions": 2, "skills": 1}
    assert by_attempt == by_run_model


# -- the golden transcript --------------------------------------------------------------------------------------

GOLDEN = Path(__file__).resolve().parent / "data" / "golden_attempt.json"
"""A recorded attempt (tests/data/regenerate.py rewrites it): p28 in TIRx, a valid kernel, the real CPU judge."""
CLOCK = re.compile(r"\[clock: [^;]*;|graded in \d+ s|Finish now\? .*? and (?=\d+ of)")


def _observations(messages) -> list[str]:
    """What the tools told the model, times left out (a replay runs without a time budget; gradings take as long
    as they take)."""
    return [CLOCK.sub("<time>", m.content) for m in messages if m.role == "tool"]


def test_the_golden_attempt_replays_with_the_same_observations(tmp_path):
    from mkb.store import ROWS

    rows = json.loads(GOLDEN.read_text())["rows"]
    db = tmp_path / "golden.duckdb"
    with Store(db) as store:
        store.put(*[cls.model_validate(row) for cls in ROWS for row in rows[cls.table]])
    result = CliRunner().invoke(main, ["--home", str(tmp_path / "home"), "--db", str(db), "replay", "p28_r1_solo_tirx",
                                       "--device", "cpu", "--json"])
    assert result.exit_code == 0, result.stderr
    compared = [(r["kind"], r["recorded_status"], r["replay_status"], r["same_kernel"])
                for r in json.loads(result.stdout)]
    assert compared == [("feedback", "passed", "passed", True), ("final", "passed", "passed", True)]
    [golden] = rows["attempts"]
    with Store(db, read_only=True) as store:
        replayed = next(a for a in store.select(Attempt) if a.attempt_id != golden["attempt_id"])
        recorded, again = store.messages(golden["attempt_id"]), store.messages(replayed.attempt_id)
    assert replayed.message.startswith(f"replay of {golden['attempt_id']}") and replayed.state == State.FINISHED
    assert [m.wire() for m in again if m.role == "assistant"] == [m.wire() for m in recorded if m.role == "assistant"]
    assert _observations(again) == _observations(recorded)
