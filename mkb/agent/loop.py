"""The agent loop: one attempt at one problem variant, from the instruction to the final grading."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mkb.agent import prompts
from mkb.agent.budget import Budget, Clock, Usage
from mkb.agent.conditions import Conditions
from mkb.agent.executor import Executor
from mkb.agent.handoff import hand_over, wire
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
    """Turns, tokens, tool calls, context handoffs."""
    wall_s: float
    """Wall-clock seconds of the attempt, everything included."""
    queue_s: float
    """Of wall_s, seconds spent waiting for a GPU (charged by the paper clock only)."""
    charged_s: float = 0.0
    """Seconds the budget clock charged (all of wall_s under the paper clock)."""
    time_left_s: float | None = None
    """Budget left when the loop stopped (None without a time limit)."""
    isolation: str
    """How the agent's commands were isolated (bwrap, docker:<image>, subprocess)."""

    @property
    def timed_out(self) -> bool:
        """The wall-clock budget ended the attempt (the original's agent timeout)."""
        return self.ending == "time"

    @property
    def speedup(self) -> float | None:
        return self.final.speedup if self.final else None


def run_attempt(problem: ProblemInfo, dsl: Dsl, model: Model, executor: Executor, budget: Budget, *,
                grade: Grade, on_message: Callable[[int, dict[str, Any]], None],
                on_submission: Callable[[Submission], None] | None = None, skill_text: str | None = None,
                gpu: prompts.Gpu = prompts.Gpu(), problems_dir: Path, conditions: Conditions = Conditions(),
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
        conditions: clock, context handling, DSL policy and sandbox size (the paper's by default).
        cancel: set it to stop the attempt between turns (state interrupted, no final grading).
        now: the clock the budget is charged on.
    """
    templates_dir = Path(problems_dir) / "templates"
    clock, usage = Clock(budget, now, conditions.clock), Usage()
    toolbox = Toolbox(executor, grade, clock, budget, on_submission, variant=(problem.id, dsl),
                      templates_dir=templates_dir)
    transcript: list[dict[str, Any]] = []
    context: list[dict[str, Any]] = []
    """What the model is sent: the transcript, or after a context handoff its pinned start and a summary."""

    def append(message: dict[str, Any], keep: bool = True) -> None:
        stamp = {"elapsed_s": round(clock.elapsed_s(), 3), "wall_s": round(clock.wall_s(), 3),
                 "at": time.time()}
        message["extra"] = {**message.get("extra", {}), **stamp}
        transcript.append(message)
        on_message(len(transcript) - 1, message)
        if keep:
            context.append(message)

    system, first = prompts.opening(problem, dsl, skill_text, gpu=gpu, budget_s=budget.wall_s,
                                    n_submissions=budget.n_submissions, workdir=executor.workdir,
                                    has_docs=has_docs(problems_dir, dsl), templates_dir=templates_dir,
                                    conditions=conditions)
    append({**system, "extra": {"isolation": executor.isolation, "limits": executor.limits,
                          "conditions": conditions.recorded()}})
    append({**first, "extra": {"skill": skill_text is not None}})
    state, detail = State.FINISHED, ""
    try:
        while (ending := _stop_reason(clock, usage, toolbox, cancel)) is None:
            toolbox.turn = usage.n_turns + 1
            try:
                completion = model.complete(wire(context), TOOL_SPECS)
            except ContextExhausted as exc:
                if conditions.context_full == "end" or not hand_over(
                        model, context, append=append, usage=usage, clock=clock, n=usage.n_handoffs + 1,
                        dsl_name=prompts.DSL_NAMES[dsl], templates_dir=templates_dir):
                    ending, detail = "context", str(exc)
                    break
                continue
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
    except ProviderError as exc:
        state, ending, detail = State.INFRA_ERROR, "provider", str(exc)
    if ending == "cancelled":
        state = State.INTERRUPTED
    time_left = None if budget.wall_s is None else round(clock.remaining_s(), 3)
    final = None
    try:
        if state == State.FINISHED:
            append({"role": "user", "content": f"[attempt over: {ENDINGS[ending]}. The final kernel.py is graded.]",
                    "extra": {"notice": "end", "ending": ending, "time_left_s": time_left}})
            final = toolbox.grade_kernel("final").record
        skill = toolbox.read_skill()
    finally:
        toolbox.close()
    status = final.status if final else Status.INFRA_ERROR if state == State.INFRA_ERROR else None
    wall_s = clock.wall_s()
    return AttemptResult(
        state=state, status=status, ending=ending, message=detail or ENDINGS[ending], final=final,
        skill_text=skill, n_submissions=budget.n_submissions - toolbox.submissions_left,
        submissions=toolbox.submissions, usage=usage, wall_s=wall_s, queue_s=clock.queue_s,
        charged_s=max(0.0, wall_s - clock.paused_s), time_left_s=time_left, isolation=executor.isolation)


def _stop_reason(clock: Clock, usage: Usage, toolbox: Toolbox, cancel: threading.Event | None) -> str | None:
    if toolbox.finished:
        return "finish"
    if cancel is not None and cancel.is_set():
        return "cancelled"
    return clock.exhausted(usage)
