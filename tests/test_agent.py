"""The agent against a real local OpenAI-compatible server (tests/scripted_server.py), real bash in a
real sandboxed workspace, and a small grade function standing in for the judge."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import jinja2
import pytest
from attempt_kit import (EXPECTED_SANDBOX, FINISH, GOOD_KERNEL, P28, PROBLEMS, SKILL, FakeClock, FakeJudge,
                         run, tool_results)
from click.testing import CliRunner
from scripted_server import Hold, call, error, raw, reply

from mkb.agent import (TOOL_NAMES, Budget, ChatModel, Gpu, LocalExecutor, ScriptedModel, parse_model_spec,
                       prepare_workspace, run_attempt, template_hashes, templates_sha256)
from mkb.agent import prompts
from mkb.agent.conditions import Conditions
from mkb.agent.tools import Submission, summarize
from mkb.errors import ConfigError
from mkb.records import Dsl, JudgeRecord, Status

__all__ = ["run"]  # a fixture, imported from attempt_kit

# -- a whole attempt ---------------------------------------------------------------------------------


def test_full_attempt_writes_submits_writes_skill_and_finishes(run, llm_server):
    result, transcript, sleeps, judge = run([
        reply("Let me look.", calls=[call("bash", {"command": "ls; head -c 60 problem.py"})],
              reasoning_content="hidden chain of thought"),
        reply(calls=[call("write_file", {"path": "kernel.py", "content": GOOD_KERNEL})]),
        reply(calls=[call("submit", {})]),
        reply(calls=[call("write_file", {"path": "SKILL.md", "content": SKILL})]),
        reply("Done.", calls=[call("finish", {"summary": "a first kernel"})]),
        reply("Yes, finish.", calls=[call("finish", {})]),
    ])
    assert (result.state, result.status, result.ending) == ("finished", Status.PASSED, "finish")
    assert result.final.speedup == 2.0 and result.speedup == 2.0
    assert result.n_submissions == 1 and [s.kind for s in result.submissions] == ["feedback", "final"]
    assert judge.sources == [GOOD_KERNEL, GOOD_KERNEL]
    assert result.skill_text == SKILL
    assert (result.usage.n_turns, result.usage.prompt_tokens, result.usage.completion_tokens) == (6, 600, 120)
    assert result.isolation == EXPECTED_SANDBOX and sleeps == []

    roles = [m["role"] for m in transcript]
    assert roles[:3] == ["system", "user", "assistant"] and roles[-1] == "user"
    assert roles.count("tool") == 6 and transcript[-1]["extra"]["notice"] == "end"
    results = tool_results(transcript)
    assert "CONTRACT.md" in results[0] and "kernel.py" in results[0] and "exit code 0" in results[0]
    assert results[2].startswith("submission 1 (feedback), graded in") and "passed: yes" in results[2]
    assert "speedup vs eager: 2.000x" in results[2] and "submissions left: 9" in results[2]
    assert "no bonus" in results[4] and "call finish again" in results[4]  # the first finish asks
    assert results[5].startswith("finished:")
    assert all("[clock:" in r and "left" in r for r in results)
    assert transcript[2]["extra"]["prompt_tokens"] == 100 and "elapsed_s" in transcript[2]["extra"]
    assert transcript[2]["extra"]["reasoning"] == "hidden chain of thought"
    assert "hidden chain" not in json.dumps(llm_server.requests[1]["messages"])  # stored, never sent back

    requests = llm_server.requests
    assert len(requests) == 6
    assert [t["function"]["name"] for t in requests[0]["tools"]] == list(TOOL_NAMES)
    assert requests[0]["model"] == "gpt-x" and requests[0]["temperature"] == 0.2
    assert requests[0]["max_completion_tokens"] == 1000
    assert all("extra" not in m for r in requests for m in r["messages"])
    assert "NVIDIA H200" in requests[0]["messages"][0]["content"]
    assert "CuTe DSL" in requests[0]["messages"][0]["content"]
    assert len(requests[-1]["messages"]) == 2 + 5 * 2
    # a hosted key never travels to a custom --base-url
    assert all("must-not-leak" not in json.dumps(h) for h in llm_server.headers_seen)


def test_skill_arm_gets_the_transfer_header_and_the_skill(run, llm_server):
    result, transcript, _, _ = run(FINISH, skill_text=SKILL)
    first_user = llm_server.requests[0]["messages"][1]["content"]
    assert "## Skill from an earlier attempt" in first_user and first_user.rstrip().endswith(SKILL.strip())
    assert "same problem in a different kernel DSL" in first_user
    assert "wrong" not in first_user and "<notes>" not in first_user  # a neutral header, as the original's
    assert transcript[1]["extra"]["skill"] is True
    assert result.skill_text is None  # the workspace's SKILL.md stayed empty


# -- ending: no bonus for finishing early, and finish asks first ------------------------------------------


def test_finish_asks_for_confirmation_and_only_a_later_finish_ends_the_attempt(run, llm_server):
    clock = FakeClock()
    result, transcript, _, judge = run([
        reply(calls=[call("write_file", {"path": "kernel.py", "content": GOOD_KERNEL}), call("finish", {}),
                     call("finish", {})]),  # two in one reply: the model has not seen the question yet
        reply(calls=[call("bash", {"command": "true"}), call("finish", {})]),
        clock.after(300, reply(calls=[call("bash", {"command": "true"})])),  # another action withdraws the request
        reply(calls=[call("finish", {"summary": "done"})]),
        reply("Yes.", calls=[call("finish", {})]),
    ], budget=Budget(wall_s=2400), now=clock)
    results = tool_results(transcript)
    asks = [r for r in results if r.startswith("Finish now?")]
    assert len(asks) == 4 and all("no bonus" in r and "call finish again" in r for r in asks)
    assert "35m00s and 10 of 10 submissions are left" in asks[-1]
    assert results[-1].startswith("finished:") and len(llm_server.requests) == 5
    assert (result.ending, result.timed_out, result.time_left_s) == ("finish", False, 2100.0)
    assert judge.sources == [GOOD_KERNEL] and transcript[-1]["extra"]["time_left_s"] == 2100.0
    confirmed = [m for m in transcript if m["role"] == "tool" and m["extra"].get("confirmed")]
    assert len(confirmed) == 1


def test_the_oracle_and_replays_confirm_their_finish():
    from mkb.protocol.attempts import oracle_model
    from mkb.settings import load_settings

    model = oracle_model(P28, Dsl.CUTEDSL, load_settings().solutions_path)
    calls = [model.complete([], []).message["tool_calls"][0]["function"]["name"] for _ in range(5)]
    assert calls == ["write_file", "submit", "write_file", "finish", "finish"]
    assert ScriptedModel([]).complete([], []).message["tool_calls"][0]["function"]["name"] == "finish"


# -- budget ----------------------------------------------------------------------------------------------


def test_time_budget_ends_the_attempt_and_the_final_kernel_is_graded(run, llm_server):
    clock = FakeClock()
    result, transcript, _, judge = run([
        clock.after(61, reply(calls=[call("write_file", {"path": "kernel.py", "content": GOOD_KERNEL})])),
        clock.after(61, reply(calls=[call("bash", {"command": "echo still working"})])),
        reply(calls=[call("finish", {})]),
    ], budget=Budget(wall_s=120), now=clock)
    assert (result.state, result.ending, result.status) == ("finished", "time", Status.PASSED)
    assert len(llm_server.requests) == 2
    assert [s.kind for s in result.submissions] == ["final"] and judge.sources == [GOOD_KERNEL]
    assert "1m01s elapsed, 0m59s left" in tool_results(transcript)[0]
    assert "0m00s left" in tool_results(transcript)[1]
    assert "wall-clock budget" in transcript[-1]["content"]


def _queued_submission(run, wall_s: float, clock: str):
    """An attempt whose two gradings (feedback, final) each wait 500 s for a GPU and take 505 s in all."""
    now = FakeClock()
    judge = FakeJudge(queue_s=500.0, on_grade=lambda: setattr(now, "t", now.t + 505.0))
    result, transcript, _, _ = run([
        now.after(10, reply(calls=[call("write_file", {"path": "kernel.py", "content": GOOD_KERNEL})])),
        reply(calls=[call("submit", {})]),
        *FINISH,
    ], budget=Budget(wall_s=wall_s), judge=judge, now=now, conditions=Conditions(clock=clock))
    return result, tool_results(transcript)


def test_the_agent_clock_does_not_charge_time_queued_for_a_gpu(run):
    result, results = _queued_submission(run, 60, "agent")
    assert result.ending == "finish" and "0m15s elapsed, 0m45s left" in results[1]
    assert result.queue_s == 1000.0 and result.wall_s == pytest.approx(1020.0)
    assert result.charged_s == pytest.approx(20.0) and result.time_left_s == pytest.approx(45.0)


def test_the_paper_clock_charges_everything_judge_queue_included(run):
    result, results = _queued_submission(run, 600, "paper")
    assert "8m35s elapsed, 1m25s left" in results[1]
    assert (result.ending, result.timed_out) == ("finish", False)
    assert result.queue_s == 1000.0 and result.charged_s == pytest.approx(1020.0)
    assert result.time_left_s == pytest.approx(85.0)  # recorded when the confirmed finish ended the loop
    result, _ = _queued_submission(run, 60, "paper")
    assert (result.ending, result.timed_out, result.time_left_s) == ("time", True, 0.0)


def test_submission_budget_and_infra_errors_are_not_charged(run):
    result, transcript, _, judge = run([
        reply(calls=[call("write_file", {"path": "kernel.py", "content": "WRONG\ndef solve(*a): pass\n"})]),
        reply(calls=[call("submit", {}), call("submit", {})]),
        reply(calls=[call("submit", {}), call("submit", {})]),
        *FINISH,
    ], budget=Budget(n_submissions=2), judge=FakeJudge(infra_first=True))
    results = tool_results(transcript)
    assert "infra_error" in results[1] and "does not count" in results[1] and "submissions left: 2" in results[1]
    assert "incorrect" in results[2] and "max error 0.5" in results[2] and "submissions left: 1" in results[2]
    assert "submissions left: 0" in results[3]
    assert results[4].startswith("error: no submissions left")
    assert result.n_submissions == 2 and len(judge.sources) == 4  # 3 feedback + final
    assert result.status == Status.INCORRECT


@pytest.mark.parametrize("budget, replies, ending", [
    (Budget(max_turns=2), 3, "turns"),
    (Budget(max_tokens=250), 4, "tokens"),  # 120 tokens a reply: over the cap after the third
])
def test_turn_and_token_caps(run, llm_server, budget, replies, ending):
    steps = [reply(calls=[call("bash", {"command": "true"})]) for _ in range(replies)]
    result, _, _, _ = run(steps, budget=budget)
    assert result.ending == ending and result.state == "finished"
    assert len(llm_server.requests) == {"turns": 2, "tokens": 3}[ending]


# -- what the model gets wrong --------------------------------------------------------------------------


def test_malformed_tool_calls_come_back_to_the_model_as_errors(run):
    result, transcript, _, _ = run([
        reply(calls=[call("write_file", '{"path": "kernel.py", "content": "unterminated'),
                     call("bash", {"cmd": "ls"}),
                     call("bash", {"command": 42}),
                     call("python", {"code": "print(1)"}),
                     call("read_file", {"path": "nope.py"}),
                     call("read_file", {"path": "../../../etc/passwd"}),
                     call("write_file", '["kernel.py", "x"]')]),
        reply("I will think without tools now."),
        reply(calls=[call("bash", {"command": "echo ok", "timeout_s": 5, "extra_key": 1})]),
        *FINISH,
    ])
    results = tool_results(transcript)
    assert "invalid arguments for write_file: not valid JSON" in results[0]
    assert "missing command" in results[1]
    assert "'command' must be a string" in results[2]
    assert "unknown tool 'python'" in results[3] and "bash, read_file, write_file, submit, finish" in results[3]
    assert "read_file failed" in results[4] and "no such file" in results[4].lower()
    assert "outside the workspace" in results[5]
    assert "expected a JSON object" in results[6]
    assert all(r.startswith("error:") for r in results[:7])
    nudge = [m for m in transcript if m.get("extra", {}).get("notice") == "no_tool_call"]
    assert len(nudge) == 1 and "called no tool" in nudge[0]["content"]
    assert results[7].startswith("exit code 0\nok")
    assert result.state == "finished" and result.ending == "finish"


# -- what the provider gets wrong -----------------------------------------------------------------------


def test_rate_limits_timeouts_and_server_errors_are_retried_with_backoff(run, llm_server):
    hold = Hold(reply(calls=[call("finish", {})]), timeout_s=5)
    config = parse_model_spec("vllm/qwen", llm_server.base_url, timeout_s=0.5)
    try:
        result, transcript, sleeps, _ = run(
            [error(429, "slow down", retry_after=3), error(500), hold, error(503), *FINISH], config=config)
    finally:
        hold.release()
    assert result.state == "finished" and result.ending == "finish"
    assert sleeps == [3.0, 4.0, 8.0, 16.0]  # Retry-After honoured, then 2 s doubling
    assert len(llm_server.requests) == 6
    assert transcript[2]["extra"]["retries"] == 4


@pytest.mark.parametrize("status, text", [(401, "invalid api key"), (404, "model gpt-x does not exist")])
def test_a_fatal_provider_error_ends_the_attempt_as_infra_error(run, llm_server, status, text):
    result, transcript, sleeps, judge = run([error(status, text)])
    assert (result.state, result.status, result.ending) == ("infra_error", Status.INFRA_ERROR, "provider")
    assert f"HTTP {status}" in result.message and text in result.message
    assert len(llm_server.requests) == 1 and sleeps == [] and judge.sources == [] and result.final is None
    assert [m["role"] for m in transcript] == ["system", "user"]


@pytest.mark.parametrize("retry_s, waits", [(6, [2.0, 4.0]), (5, [2.0, 3.0]), (0, [])])
def test_retries_stop_at_the_retry_budget_as_infra_error(run, llm_server, retry_s, waits):
    """The waits double from 2 s; the last is cut to the budget left; a budget of 0 never retries."""
    config = parse_model_spec("openai/gpt-x", llm_server.base_url, retry_s=retry_s)
    result, _, sleeps, _ = run([error(500), error(502), error(500)], config=config)
    assert result.state == "infra_error" and f"gave up after {len(waits)} retries" in result.message
    assert "MKB_MODEL_RETRY_S" in result.message
    assert sleeps == waits and len(llm_server.requests) == len(waits) + 1


@pytest.mark.parametrize("retry_after, wait", [(-5, 2.0), (float("nan"), 2.0), (float("inf"), 2.0), (1e9, 60.0),
                                               (0.5, 0.5)])
def test_a_retry_after_header_is_never_trusted_blindly(run, llm_server, retry_after, wait):
    config = parse_model_spec("openai/gpt-x", llm_server.base_url, retry_s=300)
    result, _, sleeps, _ = run([error(429, retry_after=retry_after), *FINISH], config=config)
    assert result.state == "finished" and sleeps == [wait]


_CHOICE = {"id": "c", "object": "chat.completion", "model": "scripted", "created": 0}
MALFORMED = {
    "not JSON": (raw('{"choices": [{"message": '), "the body is not JSON"),
    "an HTML page from a proxy": (raw("<html>502 Bad Gateway</html>", content_type="text/html"), "not JSON"),
    "an empty body": (raw(""), "the body is not JSON"),
    "a JSON array": (raw("[1, 2]"), "the body is an array in JSON, not an object"),
    "choices not a list": (raw(json.dumps({**_CHOICE, "choices": "none"})), "'choices' is a string, not a list"),
    "a choice without a message": (raw(json.dumps({**_CHOICE, "choices": [{"index": 0}]})),
                                   "choices[0] has no message object"),
    "tool calls not objects": (raw(json.dumps({**_CHOICE, "choices": [{"message": {"tool_calls": [7]}}]})),
                               "tool_calls[0] is a number, not an object"),
}


@pytest.mark.parametrize("name", MALFORMED)
def test_a_malformed_reply_with_http_200_ends_the_attempt_as_infra_error(run, llm_server, name):
    step, words = MALFORMED[name]
    result, transcript, sleeps, judge = run([step])
    assert (result.state, result.status, result.ending) == ("infra_error", Status.INFRA_ERROR, "provider")
    assert result.message.startswith("HTTP 200 from the provider with a malformed reply: ") and words in result.message
    assert len(llm_server.requests) == 1 and sleeps == [] and judge.sources == []
    assert [m["role"] for m in transcript] == ["system", "user"]


def test_odd_but_usable_reply_fields_are_kept_or_dropped_not_fatal(run):
    body = {**_CHOICE, "usage": "lots", "choices": [{"finish_reason": 3, "message": {
        "content": [{"type": "text", "text": "thinking "}, {"type": "text", "text": "aloud"}],
        "tool_calls": [{"id": "c1", "function": {"name": "finish", "arguments": {}}}, {"id": "no-function"}]}}]}
    result, transcript, _, _ = run([raw(json.dumps(body)), raw(json.dumps(body))])  # the finish, confirmed
    assert result.state == "finished" and result.ending == "finish"
    assert transcript[2]["content"] == "thinking aloud" and len(transcript[2]["tool_calls"]) == 1
    assert transcript[2]["tool_calls"][0]["function"] == {"name": "finish", "arguments": "{}"}
    assert "prompt_tokens" not in transcript[2]["extra"] and "finish_reason" not in transcript[2]["extra"]


def test_a_full_context_can_end_the_attempt_normally(run):
    result, _, _, judge = run([
        reply(calls=[call("write_file", {"path": "kernel.py", "content": GOOD_KERNEL})]),
        error(400, "This model's maximum context length is 8192 tokens."),
    ], conditions=Conditions(context_full="end"))
    assert (result.state, result.ending, result.status) == ("finished", "context", Status.PASSED)
    assert judge.sources == [GOOD_KERNEL] and result.usage.n_handoffs == 0


def test_cancel_stops_between_turns_without_final_grading(run):
    cancel = threading.Event()

    def cancel_then_reply(body):
        cancel.set()
        return reply(calls=[call("bash", {"command": "true"})])

    result, _, _, judge = run([cancel_then_reply, reply(calls=[call("finish", {})])], cancel=cancel)
    assert (result.state, result.ending, result.status) == ("interrupted", "cancelled", None)
    assert judge.sources == []


# -- model specs and keys ---------------------------------------------------------------------------------


def test_model_specs_and_provider_presets(monkeypatch):
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    c = parse_model_spec("openrouter/anthropic/claude-x")
    assert (c.provider, c.model, c.base_url, c.api_key_env) == (
        "openrouter", "anthropic/claude-x", "https://openrouter.ai/api/v1", "OPENROUTER_API_KEY")
    with pytest.raises(ConfigError, match="OPENROUTER_API_KEY is not set"):
        c.api_key()
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or")
    assert c.api_key() == "sk-or"
    assert parse_model_spec("vllm/qwen").api_key() == "EMPTY"
    custom = parse_model_spec("meta-llama/Llama-3.1-8B", "http://127.0.0.1:9/v1/")
    assert (custom.provider, custom.model, custom.base_url, custom.api_key_env) == (
        "custom", "meta-llama/Llama-3.1-8B", "http://127.0.0.1:9/v1", None)
    with pytest.raises(ConfigError, match="names no provider"):
        parse_model_spec("qwen3-coder")
    assert parse_model_spec("deepseek/deepseek-chat", max_output_tokens=50).request_params() == {"max_tokens": 50}
    assert parse_model_spec("openai/o3", reasoning_effort="high", max_output_tokens=9).request_params() == {
        "reasoning_effort": "high", "max_completion_tokens": 9}
    named = parse_model_spec("openai/gpt-x", "http://127.0.0.1:9/v1", api_key_env="MY_KEY")
    monkeypatch.delenv("MY_KEY", raising=False)
    with pytest.raises(ConfigError, match="MY_KEY is not set"):
        named.api_key()


def test_scripted_model_replays_and_then_finishes():
    model = ScriptedModel([{"role": "assistant", "content": "hi", "tool_calls": []}])
    assert model.complete([], []).message["content"] == "hi"
    assert model.complete([], []).message["tool_calls"][0]["function"]["name"] == "finish"


def test_reports_say_what_the_original_grader_reports():
    passed = JudgeRecord(status=Status.PASSED, problem="p28", dsl="cutedsl", device="cuda", kernel_ms=0.25,
                         eager_ms=1.0, speedup=4.0, log_tail="noise", wall_s=7.2,
                         draws=[{"seed": i, "ok": True} for i in range(5)])
    text = summarize(Submission(n=3, kind="feedback", record=passed, kernel_source="", kernel_sha256=""))
    assert text.splitlines() == [
        "submission 3 (feedback), graded in 7 s", "status: passed", "imported: yes", "correct: yes (5 of 5 draws)",
        "median of the timed calls: kernel 0.2500 ms, eager 1.0000 ms", "speedup vs eager: 4.000x", "passed: yes"]
    wrong = JudgeRecord(status=Status.INCORRECT, problem="p28", dsl="cutedsl", device="cuda",
                        message="draw 2: out: max error 0.5 > allowance 0.01", log_tail="printed by solve",
                        draws=[{"seed": i, "ok": i % 2 == 0} for i in range(5)])
    text = summarize(Submission(n=1, kind="feedback", record=wrong, kernel_source="", kernel_sha256=""))
    assert "correct: no (3 of 5 draws)" in text and "max error 0.5" in text and "passed: no" in text
    assert "printed by solve" not in text  # output of solve is not part of a report (the original's rule)
    crashed = JudgeRecord(status=Status.CRASHED, problem="p28", dsl="cutedsl", device="cuda",
                          message="the candidate process died", log_tail="x" * 5000)
    text = summarize(Submission(n=1, kind="feedback", record=crashed, kernel_source="", kernel_sha256=""))
    assert "crashed" in text and "output tail:" in text and len(text) < 2300


# -- prompts ----------------------------------------------------------------------------------------------


def _instruction(dsl: Dsl, templates_dir: Path = PROBLEMS / "templates") -> str:
    return prompts.instruction(P28, dsl, gpu=Gpu(), budget_s=2400, n_submissions=10, workdir="/workspace",
                               has_docs=True, templates_dir=templates_dir)


def test_instruction_follows_the_design_order_and_rules():
    text = _instruction(Dsl.TIRX)
    order = ["# Task", "# What counts", "# Deliverables", "# Implementation boundary", "# Grading contract",
             "# Environment", "# Submissions and budget", "# Suggested workflow"]
    assert [text.index(h) for h in order] == sorted(text.index(h) for h in order)
    assert "NVIDIA H200" in text and "sm_90a" in text and "TIRx" in text and "40 minutes" in text
    assert "10 feedback submissions" in text and "Leave out: the rules of the task, code" in text and "3 ×" in text
    assert "no bonus for finishing early" in text and "2 CPU cores" in text and "8 GB of memory" in text
    assert P28.description in text


def test_the_two_dsl_variants_differ_only_in_the_dsl_names():
    def normalised(dsl: Dsl) -> str:
        text = _instruction(dsl).replace(prompts.OTHER_DSL_NAMES[dsl], "<OTHER>")
        return text.replace(prompts.DSL_NAMES[dsl], "<DSL>")

    assert normalised(Dsl.CUTEDSL) == normalised(Dsl.TIRX)
    assert "cute.compile" not in _instruction(Dsl.CUTEDSL) and "tvm.compile" not in _instruction(Dsl.TIRX)


def test_templates_are_strict_and_hashed(tmp_path):
    import shutil

    copy_dir = tmp_path / "templates"
    shutil.copytree(PROBLEMS / "templates", copy_dir)
    hashes = template_hashes(copy_dir)
    assert {"instruction.md.j2", "contract.md.j2", "skill_rules.md.j2", "skill_transfer.md.j2"} <= set(hashes)
    before = templates_sha256(copy_dir)
    (copy_dir / "nudge.md.j2").write_text("{{ not_given }}")
    assert templates_sha256(copy_dir) != before
    with pytest.raises(jinja2.UndefinedError):
        prompts.render("nudge.md.j2", copy_dir)


def test_workspace_holds_only_public_material(tmp_path):
    ws = prepare_workspace(P28, Dsl.CUTEDSL, tmp_path / "ws", PROBLEMS)
    assert sorted(p.name for p in ws.iterdir()) == ["CONTRACT.md", "SKILL.md", "docs", "kernel.py", "problem.py"]
    assert (ws / "problem.py").read_text() == Path(P28.path).read_text()
    assert (ws / "kernel.py").read_text() == "" and "Grading contract: p28 in CuTe DSL" in (ws / "CONTRACT.md").read_text()


def test_an_attempt_runs_in_a_docker_container(docker_engine, llm_server, tmp_path):
    from conftest import TEST_IMAGE

    from mkb.agent.docker_executor import DockerExecutor
    from mkb.agent.limits import SandboxLimits

    llm_server.script([
        reply(calls=[call("write_file", {"path": "kernel.py", "content": GOOD_KERNEL}),
                     call("bash", {"command": "grep -c solve kernel.py; ls; echo $CUDA_VISIBLE_DEVICES."})]),
        reply(calls=[call("submit", {}), call("write_file", {"path": "SKILL.md", "content": SKILL})]),
        *FINISH,
    ])
    workspace = prepare_workspace(P28, Dsl.CUTEDSL, tmp_path / "ws", PROBLEMS)
    executor = DockerExecutor(workspace, TEST_IMAGE, limits=SandboxLimits(cpus=1, memory_mb=512), client=docker_engine)
    judge, transcript = FakeJudge(), []
    try:
        config = parse_model_spec("openai/gpt-x", llm_server.base_url)
        result = run_attempt(P28, Dsl.CUTEDSL, ChatModel(config), executor, Budget(), grade=judge,
                             on_message=lambda seq, m: transcript.append(m), problems_dir=PROBLEMS)
    finally:
        executor.close()
    assert result.isolation == f"docker:{TEST_IMAGE}" and result.status == Status.PASSED
    assert judge.sources == [GOOD_KERNEL, GOOD_KERNEL] and result.skill_text == SKILL
    bash = tool_results(transcript)[1]
    assert bash.startswith("exit code 0\n1\n") and "CONTRACT.md" in bash and "\n.\n" in bash
    assert (workspace / "kernel.py").read_text() == ""  # the container holds the only copy
    assert "/workspace" in llm_server.requests[0]["messages"][0]["content"]


@pytest.mark.parametrize("command", ["attempt", "run-model"])
def test_a_malformed_reply_is_a_recorded_infra_error_in_attempt_and_run_model(command, llm_server, tmp_path):
    """Both ways of running an attempt see the same error: stored as infra_error with the reason, no traceback."""
    from mkb.cli import main
    from mkb.store import Store

    llm_server.script([raw("{not json")] * 4)
    db = tmp_path / "malformed.duckdb"
    endpoint = ["--base-url", llm_server.base_url, "--device", "cpu"]
    argv = (["attempt", "p28", "--dsl", "cutedsl", "--model", "openai/gpt-x", *endpoint] if command == "attempt" else
            ["run-model", "openai/gpt-x", "--problems", "p28", "--arms", "solo_cutedsl", "--concurrency", "1", *endpoint])
    result = CliRunner().invoke(main, ["--db", str(db), *argv])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    with Store(db, read_only=True) as store:
        attempt = store.rows("SELECT state, status, message FROM attempts")[0]
        trial = store.rows("SELECT state, status, message FROM trials")[0]
    assert (attempt["state"], attempt["status"]) == ("infra_error", "infra_error")
    assert (trial["state"], trial["status"]) == ("infra_error", "infra_error")
    for message in (attempt["message"], trial["message"]):
        assert "HTTP 200 from the provider with a malformed reply: the body is not JSON" in message


def test_file_tool_errors_name_the_workspace_path_never_the_host_one(run, tmp_path):
    calls = [call("read_file", {"path": "missing.py"}), call("read_file", {"path": "docs/../absent/x.txt"}),
             call("write_file", {"path": "kernel.py/inner.py", "content": "x"}),
             call("bash", {"command": "ln -s loop loop && rm kernel.py && ln -s kernel.py kernel.py && echo made"}),
             call("read_file", {"path": "loop"}), call("write_file", {"path": "loop", "content": "x"})]
    result, transcript, _, judge = run([reply(calls=calls), *FINISH])
    texts = tool_results(transcript)
    assert texts[0].startswith("error: read_file failed: missing.py: No such file or directory")
    assert texts[1].startswith("error: read_file failed: docs/../absent/x.txt: No such file or directory")
    assert texts[2].startswith("error: write_file failed: kernel.py/inner.py: File exists")
    assert texts[4].startswith("error: read_file failed: loop: Too many levels of symbolic links")
    assert texts[5].startswith("error: write_file failed: loop: Too many levels of symbolic links")
    assert all(str(tmp_path) not in t for t in texts), texts
    # a kernel.py that is a symlink loop is read as an empty file: never sent to the judge, the final grading is an
    # import_error with the reason (feedback.precheck), and the attempt ends normally, charged
    assert (result.state, result.status, judge.sources) == ("finished", "import_error", [])
