"""The attempt function every path runs: a fresh workspace and sandbox, the agent loop, the transcript
written as it happens, and the Outcome; plus the model behind it (a chat model or the `reference` oracle)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from mkb.agent.budget import Budget
from mkb.agent.conditions import Conditions
from mkb.agent.executor import Executor, LocalExecutor
from mkb.agent.limits import SandboxLimits
from mkb.agent.loop import run_attempt
from mkb.agent.model import Model, ModelConfig, ScriptedModel, parse_model_spec, tool_call
from mkb.agent.prompts import Gpu
from mkb.agent.workspace import prepare_workspace
from mkb.environment import Device
from mkb.protocol.runner import AttemptContext, AttemptFn
from mkb.records import Dsl, ProblemInfo, TrialSpec
from mkb.settings import Settings
from mkb.trial import Outcome, Sink, Transcript

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
        {"content": "Confirmed.", "tool_calls": [tool_call("finish", {})]},
    ])


def model_config(model: str, base_url: str | None, api_key_env: str | None,
                 sampling: dict | None, retry_s: float | None = None) -> ModelConfig | None:
    """The model's configuration (None for the oracle); a missing key fails here, in one line, before anything runs.

    retry_s is the model_retry_s setting (None: ModelConfig's default)."""
    if model == ORACLE:
        return None
    config = parse_model_spec(model, base_url, api_key_env, **(sampling or {}), retry_s=retry_s)
    config.api_key()
    return config


def model_factory(config: ModelConfig | None, solutions_dir: Path) -> Callable[[TrialSpec], Model]:
    """A fresh model per attempt: a chat model for config, the oracle for None."""
    if config is None:
        return lambda spec: oracle_model(spec.problem, spec.arm.dsl, solutions_dir)
    from mkb.agent.model import ChatModel

    return lambda spec: ChatModel(config)


def gpu_named(device: Device) -> Gpu:
    """The GPU the instruction names: the judge's first GPU, or the CPU mode."""
    return Gpu(name=device.name, arch=device.arch)


def sandbox_limits(settings: Settings) -> SandboxLimits:
    """An attempt's resources: the CPUs and memory the instruction states (the paper's 2 CPUs, 8 GB by default)."""
    return SandboxLimits(memory_mb=settings.sandbox_memory_mb, cpus=settings.sandbox_cpus)


def make_executor(settings: Settings, workspace: Path) -> Executor:
    """The sandbox of one attempt (settings.sandbox); it hides MKB_HOME, the problem set and the solutions."""
    if settings.sandbox == "docker":
        from mkb.agent.docker_executor import DockerExecutor

        return DockerExecutor(workspace, settings.image, limits=sandbox_limits(settings))
    return LocalExecutor(workspace, isolate=settings.sandbox == "local", allow_unsafe=settings.unsafe_sandbox,
                         limits=sandbox_limits(settings),
                         hide=(settings.home, settings.problems_dir, settings.solutions_path))


def make_attempt(sink: Sink, model_name: str, model_for: Callable[[TrialSpec], Model], budget: Budget,
                 grade_for: Callable[[TrialSpec], Callable], settings: Settings, gpu: Gpu) -> AttemptFn:
    """Wire one attempt: a fresh workspace, the agent loop, transcript and submissions into the sink."""

    conditions = Conditions.of(settings)

    def attempt(spec: TrialSpec, ctx: AttemptContext) -> Outcome:
        workdir = prepare_workspace(spec.problem, spec.arm.dsl, settings.home / "workspaces" / slug(model_name)
                                    / spec.trial_id / ctx.attempt_id, settings.problems_dir, conditions)
        executor = make_executor(settings, workdir)
        transcript = Transcript(sink, ctx.attempt_id)
        try:
            result = run_attempt(spec.problem, spec.arm.dsl, model_for(spec), executor, budget,
                                 grade=grade_for(spec), on_message=transcript.message,
                                 on_submission=transcript.submission, skill_text=ctx.skill_text, gpu=gpu,
                                 problems_dir=settings.problems_dir, conditions=conditions, cancel=ctx.cancel)
        finally:
            executor.close()
        return Outcome.of(result, conditions)

    return attempt
