"""A full context is handed over to the model's own summary and the attempt goes on (the original's agent),
against the scripted server made into a model with a small context (server.context_chars)."""

from __future__ import annotations

import json

from attempt_kit import FINISH, GOOD_KERNEL, run, tool_results
from scripted_server import call, reply

from mkb.agent.handoff import recent

__all__ = ["run"]  # a fixture, imported from attempt_kit

NOISE = "python -c \"print('x' * 3000)\""
"""A command whose output (3 kB) fills the small context quickly."""


def _sizes(llm_server) -> list[int]:
    return [len(json.dumps(r["messages"])) for r in llm_server.requests]


def _start_size(run, llm_server) -> int:
    run(FINISH)
    return _sizes(llm_server)[0]


def test_a_full_context_is_summarized_and_the_attempt_goes_on(run, llm_server):
    limit = _start_size(run, llm_server) + 9000
    llm_server.context_chars = limit
    result, transcript, _, judge = run([
        reply(calls=[call("write_file", {"path": "kernel.py", "content": GOOD_KERNEL})]),
        reply(calls=[call("bash", {"command": NOISE})]),
        reply(calls=[call("bash", {"command": NOISE})]),
        reply(calls=[call("bash", {"command": NOISE})]),  # the next request no longer fits
        reply("I wrote kernel.py (valid, untested on the GPU); next: submit it."),  # the summary
        reply(calls=[call("submit", {})]),
        *FINISH,
    ])
    sizes = _sizes(llm_server)
    assert max(s for s in sizes if s <= limit) <= limit < max(sizes)  # one request was refused for its size
    assert (result.state, result.ending, result.usage.n_handoffs) == ("finished", "finish", 1)
    notices = [m["extra"].get("notice") for m in transcript if m["extra"].get("notice")]
    assert notices == ["handoff_request", "handoff_summary", "handoff", "end"]
    summary_request = next(r for r in llm_server.requests if "limit of the model's context" in
                           r["messages"][-1]["content"])
    assert summary_request["messages"][0]["role"] == "system" and len(json.dumps(summary_request["messages"])) <= limit
    after = llm_server.requests[-3]["messages"]  # the request that answered with submit
    assert [m["role"] for m in after] == ["system", "user", "user"]
    assert "context handoff 1" in after[2]["content"] and "next: submit it" in after[2]["content"]
    assert "passed: yes" in tool_results(transcript)[-3] and judge.sources == [GOOD_KERNEL, GOOD_KERNEL]
    assert [m["role"] for m in transcript].count("tool") == 7  # nothing left the transcript


def test_when_not_even_the_summary_request_fits_the_attempt_ends(run, llm_server):
    llm_server.context_chars = _start_size(run, llm_server) + 200
    result, transcript, _, judge = run([
        reply(calls=[call("write_file", {"path": "kernel.py", "content": GOOD_KERNEL})]),
        reply(calls=[call("bash", {"command": NOISE})]),
    ])
    assert (result.state, result.ending, result.usage.n_handoffs) == ("finished", "context", 0)
    assert judge.sources == [GOOD_KERNEL] and "maximum context length" in result.message


def test_the_history_sent_with_a_summary_request_starts_at_an_assistant_message():
    history = [{"role": "assistant", "content": "a" * 100, "tool_calls": [{"id": "1"}]},
               {"role": "tool", "tool_call_id": "1", "content": "b" * 400},
               {"role": "assistant", "content": "c" * 100},
               {"role": "user", "content": "d" * 100}]
    assert recent(history, 1.0) == history
    assert recent(history, 0.4) == history[2:]  # the tool result alone would be an orphan
    assert recent(history, 0.0) == []
