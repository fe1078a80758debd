"""The agent loop: one attempt at one problem variant, from the instruction to the final grading."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mkb.agent import prompts
from mkb.agent.budget import Budget, Clock, Usage
from mkb.agent.executor import Executor
from mkb.agent.model import ContextExhausted, Model, ProviderError
from mkb.agent.tools import TOOL_SPECS, Grade, Submission, Toolbox, ToolResult
from mkb.agent.workspace import has_docs
from mkb.records import Dsl, JudgeRecord, ProblemInfo, Record, State, Status

ENDINGS = {
    "finish": "the agent called finish", "time": "the wall-clock budget is spent",
    "turns": "the turn cap is reached", "tokens": "the token cap is reached",
    "context": "the conversation no longer fits the model's context", "cancelled": "the run was cancelled",
    "provider": "the model provider failed",
}
"""Why an attempt's loop stopped."""


class AttemptResult(Record):
    """How one attempt ended and what it produced."""

    state: State
    """finished (the loop ended and the final kernel was graded), infra_error (the provider failed:
    rerun, never charged) or interrupted (cancelled)."""
    status: Status | None = None
    """Status of the final grading (infra_error when the state is); None when interrupted."""
    ending: str
    """Why the loop stopped; a key of ENDINGS."""
    message: str = ""
    """Details of the ending (the provider's error, for instance)."""
    final: JudgeRecord | None = None
    """The final grading: the attempt's result."""
    skill_text: str | None = None
    """SKILL.md as the agent left it (None when missing or blank)."""
    n_submissions: int = 0
    """Feedback submissions charged to the budget."""
    submissions: list[Submission] = []
    """Every grading, feedback and final, in order."""
    usage: Usage
    """Turns, tokens, tool calls."""
    wall_s: float
    """Wall-clock seconds of the attempt, everything included."""
    queue_s: float
    """Of wall_s, seconds spent waiting for a GPU (not charged)."""
    isolation: str
    """How the agent's commands were isolated (bwrap, docker:<image>, subprocess)."""

    @property
    def speedup(self) -> float | None:
        return self.final.speedup if self.final else None


def run_attempt(problem: ProblemInfo, dsl: Dsl, model: Model, executor: Executor, budget: Budget, *,
                grade: Grade, on_message: Callable[[int, dict[str, Any]], None],
                on_submission: Callable[[Submission], None] | None = None, skill_text: str | None = None,
                gpu: prompts.Gpu = prompts.Gpu(), problems_dir: Path, dsl_policy: str = "paper",
                cancel: threading.Event | None = None, now: Callable[[], float] = time.monotonic) -> AttemptResult:
    """Run one attempt in an already prepared workspace and grade its final kernel.py.

    Args:
        model: answers the message list (ChatModel, or ScriptedModel for replays).
        executor: the attempt's workspace (LocalExecutor or DockerExecutor); not closed here.
        grade: grade(kernel_path) for this problem variant; see tools.Grade.
        on_message: called with (seq, message) as each message is appended (the transcript).
        on_submission: called with each Submission as it is graded.
        skill_text: a transferred skill (skill arms); it goes into the first user message.
        problems_dir: the problem set's root (templates and DSL docs).
        dsl_policy: the DSL-use policy the kernels are graded under (the instruction states it).
        cancel: set it to stop the attempt between turns (state interrupted, no final grading).
        now: the clock the budget is charged on.
    """
    templates_dir = Path(problems_dir) / "templates"
    clock, usage = Clock(budget, now), Usage()
    toolbox = Toolbox(executor, grade, clock, budget, on_submission)
    messages: list[dict[str, Any]] = []

    def append(message: dict[str, Any]) -> None:
        stamp = {"elapsed_s": round(clock.elapsed_s(), 3), "wall_s": round(clock.wall_s(), 3),
                 "at": time.time()}
        message["extra"] = {**message.get("extra", {}), **stamp}
        messages.append(message)
        on_message(len(messages) - 1, message)

    system = prompts.instruction(problem, dsl, gpu=gpu, budget_s=budget.wall_s, n_submissions=budget.n_submissions,
                                 workdir=executor.workdir, has_docs=has_docs(problems_dir, dsl),
                                 templates_dir=templates_dir, dsl_policy=dsl_policy)
    append({"role": "system", "content": system, "extra": {"isolation": executor.isolation, "limits": executor.limits}})
    append({"role": "user", "content": prompts.kickoff(executor.workdir, skill_text, templates_dir),
            "extra": {"skill": skill_text is not None}})
    state, detail = State.FINISHED, ""
    try:
        while (ending := _stop_reason(clock, usage, toolbox, cancel)) is None:
            completion = model.complete(_wire(messages), TOOL_SPECS)
            clock.pause(completion.waited_s)
            usage.add(completion.extra)
            append({**completion.message, "extra": completion.extra})
            calls = completion.message.get("tool_calls") or []
            if not calls:
                append({"role": "user", "content": prompts.render("nudge.md.j2", templates_dir),
                        "extra": {"notice": "no_tool_call"}})
            for call in calls:
                usage.n_tool_calls += 1
                result = ToolResult("not run: the attempt already finished") if toolbox.finished else toolbox.run(call)
                name = (call.get("function") or {}).get("name")
                append({"role": "tool", "tool_call_id": call.get("id"),
                        "content": f"{result.text}\n{clock.line(toolbox.submissions_left)}",
                        "extra": {"tool": name, **result.extra}})
    except ContextExhausted as exc:
        ending, detail = "context", str(exc)
    except ProviderError as exc:
        state, ending, detail = State.INFRA_ERROR, "provider", str(exc)
    if ending == "cancelled":
        state = State.INTERRUPTED
    final = None
    try:
        if state == State.FINISHED:
            append({"role": "user", "content": f"[attempt over: {ENDINGS[ending]}. The final kernel.py is graded.]",
                    "extra": {"notice": "end", "ending": ending}})
            final = toolbox.grade_kernel("final").record
        skill = toolbox.read_skill()
    finally:
        toolbox.close()
    status = final.status if final else Status.INFRA_ERROR if state == State.INFRA_ERROR else None
    return AttemptResult(
        state=state, status=status, ending=ending, message=detail or ENDINGS[ending], final=final,
        skill_text=skill, n_submissions=budget.n_submissions - toolbox.submissions_left,
        submissions=toolbox.submissions, usage=usage, wall_s=clock.wall_s(), queue_s=clock.queue_s,
        isolation=executor.isolation)


def _stop_reason(clock: Clock, usage: Usage, toolbox: Toolbox, cancel: threading.Event | None) -> str | None:
    if toolbox.finished:
        return "finish"
    if cancel is not None and cancel.is_set():
        return "cancelled"
    return clock.exhausted(usage)


def _wire(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The message list as the API expects it: per-message metadata ('extra') stripped."""
    return [{k: v for k, v in m.items() if k != "extra"} for m in messages]
