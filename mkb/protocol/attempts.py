"""Attempt functions for the protocol runner: a model through the agent loop, or the `reference` oracle."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from mkb.agent.budget import Budget
from mkb.agent.loop import AttemptResult, run_attempt
from mkb.agent.model import Model, ScriptedModel, tool_call
from mkb.agent.prompts import Gpu
from mkb.agent.workspace import prepare_workspace
from mkb.protocol.plan import TrialSpec
from mkb.protocol.runner import AttemptContext, AttemptFn, Outcome
from mkb.records import Dsl, ProblemInfo
from mkb.store import Store

ORACLE = "reference"
"""The built-in offline agent's model name: it submits the shipped validated solutions (an oracle)."""

ORACLE_SKILL = """\
# Skill written by the `reference` oracle (not a model)

This attempt was made by MKB's built-in `reference` agent, an oracle: it submitted the project's shipped,
validated {dsl} solution for problem {problem} ({name}) unchanged and learned nothing. It exists so the
whole protocol and every table can be produced without a model; its rows measure the pipeline, not transfer.

Facts about the task: {description}
"""


def slug(model: str) -> str:
    """A model name made safe for a directory name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", model)


def solution_path(solutions_dir: Path, problem: ProblemInfo, dsl: Dsl) -> Path:
    """Where the shipped validated solution of a variant lives (never shown to agents)."""
    return Path(solutions_dir) / str(dsl) / f"{problem.id}.py"


def oracle_model(problem: ProblemInfo, dsl: Dsl, solutions_dir: Path) -> ScriptedModel:
    """A scripted 'model' that writes the shipped solution, submits it, writes the fixed skill, finishes.

    The plan gives the oracle only problems with a shipped solution (protocol.oracle_problems)."""
    kernel = solution_path(solutions_dir, problem, dsl).read_text()
    skill = ORACLE_SKILL.format(dsl=dsl, problem=problem.id, name=problem.name, description=problem.description)
    return ScriptedModel([
        {"content": "Writing the shipped solution.", "tool_calls": [tool_call("write_file", {"path": "kernel.py",
                                                                                             "content": kernel})]},
        {"content": None, "tool_calls": [tool_call("submit", {})]},
        {"content": None, "tool_calls": [tool_call("write_file", {"path": "SKILL.md", "content": skill})]},
        {"content": None, "tool_calls": [tool_call("finish", {"summary": "submitted the shipped solution"})]},
    ])


def outcome(result: AttemptResult) -> Outcome:
    """The protocol's view of an agent attempt."""
    final = result.final
    return Outcome(
        state=result.state, status=None if result.status is None else str(result.status),
        speedup=final.speedup if final else None, kernel_ms=final.kernel_ms if final else None,
        eager_ms=final.eager_ms if final else None, skill_text=result.skill_text,
        prompt_tokens=result.usage.prompt_tokens, completion_tokens=result.usage.completion_tokens,
        cost_usd=result.usage.cost_usd, n_submissions=result.n_submissions, n_turns=result.usage.n_turns,
        wall_s=max(0.0, result.wall_s - result.queue_s), queue_s=result.queue_s,
        message=f"{result.ending}: {result.message}" if result.message else result.ending)


def make_attempt(store: Store, model_name: str, model_for: Callable[[TrialSpec], Model], budget: Budget,
                 grade_for: Callable[[TrialSpec], Callable], executor_for: Callable[[Path], object],
                 workspaces: Path, problems_dir: Path, gpu: Gpu) -> AttemptFn:
    """Wire one attempt: a fresh workspace, the agent loop, submissions and transcript into the store."""

    def attempt(spec: TrialSpec, ctx: AttemptContext) -> Outcome:
        workdir = prepare_workspace(spec.problem, spec.arm.dsl,
                                    workspaces / slug(model_name) / spec.trial_id / ctx.attempt_id, problems_dir)
        executor = executor_for(workdir)
        try:
            result = run_attempt(
                spec.problem, spec.arm.dsl, model_for(spec), executor, budget, grade=grade_for(spec),
                on_message=ctx.on_message, skill_text=ctx.skill_text, gpu=gpu, problems_dir=problems_dir,
                cancel=ctx.cancel,
                on_submission=lambda s: store.add_submission(
                    ctx.attempt_id, s.n, s.kind, s.record, kernel_source=s.kernel_source,
                    kernel_sha256=s.kernel_sha256, queue_s=s.queue_s))
        finally:
            close = getattr(executor, "close", None)
            if close:
                close()
        return outcome(result)

    return attempt
