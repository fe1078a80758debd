"""One agent attempt against the scripted OpenAI-compatible server, for the agent's tests: a fake judge, a
fake clock, and run(steps, ...) -> (result, transcript, sleeps, judge) at p28 in CuTe DSL."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from scripted_server import call, reply

from mkb.agent import Budget, ChatModel, LocalExecutor, parse_model_spec, prepare_workspace, run_attempt
from mkb.agent.conditions import Conditions
from mkb.agent.executor import bwrap_problem
from mkb.problems import catalog_for, resolve
from mkb.records import Dsl, JudgeRecord, Status

EXPECTED_SANDBOX = "subprocess" if bwrap_problem() else "bwrap"
"""The local executor's isolation here: bwrap where it works (CI installs it), else its loud fallback."""

REPO = Path(__file__).resolve().parent.parent
PROBLEMS = REPO / "problems"
P28 = resolve("p28", catalog_for(PROBLEMS))
GOOD_KERNEL = "import torch\n\ndef solve(x, residual, weight):\n    return x\n"
SKILL = "Memory-bound row reduction: one pass over each row, keep the sum of squares in fp32.\n"
FINISH = [reply(calls=[call("finish", {})]), reply("Confirmed.", calls=[call("finish", {})])]
"""finish, then its confirmation: the attempt ends on the second."""


class FakeJudge:
    """grade(kernel_path) for tests: empty -> import_error, 'WRONG' -> incorrect, else passed at 2x."""

    def __init__(self, queue_s: float = 0.0, infra_first: bool = False, on_grade=None):
        self.sources: list[str] = []
        self.queue_s, self.infra_first, self.on_grade = queue_s, infra_first, on_grade

    def __call__(self, kernel_path: str) -> JudgeRecord:
        source = Path(kernel_path).read_text()
        self.sources.append(source)
        if self.on_grade:
            self.on_grade()
        base = {"problem": "p28", "dsl": "cutedsl", "device": "cuda", "details": {"queue_s": self.queue_s}}
        if self.infra_first and len(self.sources) == 1:
            return JudgeRecord(status=Status.INFRA_ERROR, message="GPU lost", **base)
        if "def solve" not in source:
            return JudgeRecord(status=Status.IMPORT_ERROR, message="kernel.py defines no solve()", **base)
        if "WRONG" in source:
            return JudgeRecord(status=Status.INCORRECT, message="out[0]: max error 0.5 > allowance 0.01", **base)
        return JudgeRecord(status=Status.PASSED, kernel_ms=0.5, eager_ms=1.0, speedup=2.0, **base)


class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def after(self, seconds: float, step: dict):
        """A server step that advances this clock before answering."""
        def play(body):
            self.t += seconds
            return step
        return play


@pytest.fixture
def run(llm_server, tmp_path, monkeypatch):
    """run(steps, budget=..., **kw) -> (result, transcript, sleeps, judge): one attempt at p28/cutedsl."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-must-not-leak")

    def go(steps, budget=Budget(), judge=None, now=None, config=None, cancel=None, skill_text=None,
           conditions=Conditions()):
        llm_server.script(steps)
        config = config or parse_model_spec("openai/gpt-x", llm_server.base_url, temperature=0.2,
                                            max_output_tokens=1000)
        sleeps: list[float] = []
        judge = judge or FakeJudge()
        workspace = prepare_workspace(P28, Dsl.CUTEDSL, tmp_path / f"attempt{len(list(tmp_path.iterdir()))}" / "ws",
                                      PROBLEMS)
        executor = LocalExecutor(workspace, hide=(REPO,))
        transcript: list[tuple[int, dict]] = []
        try:
            result = run_attempt(P28, Dsl.CUTEDSL, ChatModel(config, sleep=sleeps.append), executor, budget,
                                 grade=judge, on_message=lambda seq, m: transcript.append((seq, copy.deepcopy(m))),
                                 skill_text=skill_text, cancel=cancel, now=now or FakeClock(),
                                 problems_dir=PROBLEMS, conditions=conditions)
        finally:
            executor.close()
        return result, [m for _, m in transcript], sleeps, judge

    return go


def tool_results(transcript: list[dict]) -> list[str]:
    return [m["content"] for m in transcript if m["role"] == "tool"]
