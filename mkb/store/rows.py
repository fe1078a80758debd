"""The rows of the results database as typed records: what the store writes and what its reads return.

Each record names its table and key; its fields are the table's columns (a test keeps them equal), so a
new column is a field here plus a numbered migration in mkb/store/migrations.py.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, field_validator

from mkb.records import Arm, Dsl, JudgeRecord, State, Status, Timings


class Row(BaseModel):
    """Base of every stored row: immutable, documented fields; JSON columns arrive from DuckDB as text."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True, extra="forbid")

    table: ClassVar[str]
    keys: ClassVar[tuple[str, ...]]
    json_columns: ClassVar[tuple[str, ...]] = ()

    @field_validator("*", mode="before")
    @classmethod
    def _parse_json(cls, value: Any, info) -> Any:
        if info.field_name in cls.json_columns and isinstance(value, str):
            return json.loads(value)
        return value

    def columns(self) -> dict[str, Any]:
        """The row as column values (JSON columns still as Python objects; the store encodes them)."""
        return self.model_dump(mode="python")


class Run(Row):
    """One protocol run, single attempt or replay [run_id]."""

    table: ClassVar[str] = "runs"
    keys: ClassVar[tuple[str, ...]] = ("run_id",)
    json_columns: ClassVar[tuple[str, ...]] = ("params", "versions", "gpus")

    run_id: str
    """Id of the run."""
    model: str
    """Model id (the oracle agent is `reference`)."""
    provider: str | None = None
    """Provider preset (openai, openrouter, vllm, ...), `oracle`, or `replay`."""
    base_url: str | None = None
    """Endpoint the model was reached at."""
    api_key_env: str | None = None
    """Name of the variable that held the key (never the key)."""
    is_oracle: bool = False
    """The run is the built-in reference agent (validated solutions), not a model."""
    params: dict[str, Any] | None = None
    """Model settings, request parameters, budget, sandbox and judge device (one shape on every path)."""
    versions: dict[str, str] | None = None
    """Toolchain and package versions."""
    git_commit: str | None = None
    """Commit of the mkb checkout ('+dirty' with local changes)."""
    host: str | None = None
    """Host name of the driver (the process that runs the run and writes its rows)."""
    owner_pid: int | None = None
    """The driver's process id; with host and owner_start it tells a later mkb whether the run is still under way."""
    owner_start: str | None = None
    """The driver's start: '<boot id>/<start time in clock ticks>' (Linux), so a reused pid is not taken for it."""
    gpus: list[dict[str, Any]] | None = None
    """The GPUs the judge used."""
    command: str | None = None
    """The command line that started the run."""
    state: State = State.RUNNING
    """running, finished or interrupted."""
    started_at: datetime
    """UTC."""
    finished_at: datetime | None = None
    """UTC."""


class Progress(Row):
    """The columns a trial and an attempt share: where it stands, and when it started and ended."""

    run_id: str | None = None
    """The run that wrote it."""
    state: State
    """See State."""
    status: Status | None = None
    """Judge status of the final grading."""
    fingerprint: str | None = None
    """sha256 of the trial's fingerprint parts when the attempt began."""
    message: str | None = None
    """Why it ended this way (a replay's names the attempt it replays)."""
    started_at: datetime | None = None
    """UTC."""
    finished_at: datetime | None = None
    """UTC."""


class Trial(Progress, Timings):
    """The current state of one trial of one model [model, trial_id]; earlier attempts stay in `attempts`.

    Its timings are the final grading's."""

    table: ClassVar[str] = "trials"
    keys: ClassVar[tuple[str, ...]] = ("model", "trial_id")
    json_columns: ClassVar[tuple[str, ...]] = ("fingerprint_parts",)

    model: str
    """Model id."""
    trial_id: str
    """p<NN>_r<k>_<arm>."""
    attempt_id: str | None = None
    """The attempt that produced the current state (None when skipped)."""
    problem_id: str
    """e.g. p07."""
    replicate: int
    """k >= 1."""
    arm: Arm
    """One of the four arms."""
    dsl: Dsl
    """The arm's DSL."""
    source_trial_id: str | None = None
    """Skill arms: the solo trial whose SKILL.md was given (None when the skill came from a file)."""
    fingerprint_parts: dict[str, Any] | None = None
    """What the result depended on: problem, templates, docs, toolchain, source skill, budget."""
    skill_sha256: str | None = None
    """sha256 of the skill text given to a skill trial."""
    wall_s: float | None = None
    """Agent time: the attempt's wall clock minus the time its gradings waited for a judge (queue_s)."""
    queue_s: float | None = None
    """Seconds the attempt's gradings waited for a judge worker."""
    charged_s: float | None = None
    """Seconds the budget clock charged (under the paper clock, all of total_s)."""
    total_s: float | None = None
    """The attempt's wall clock, everything included (queue, grading, provider backoff)."""
    time_left_s: float | None = None
    """Budget left when the attempt ended (at finish: what finishing early gave up)."""
    ending: str | None = None
    """Why the attempt's loop stopped: finish, time, turns, tokens, context, cancelled, provider."""
    timed_out: bool | None = None
    """The wall-clock budget ended the attempt (ending 'time'; the original's timed_out)."""
    n_handoffs: int | None = None
    """Times a full context was handed over to the model's own summary."""
    n_correct_draws: int | None = None
    """Correctness draws of the final grading the kernel got right (of 5)."""
    n_submissions: int | None = None
    """Feedback submissions charged (<= the budget's)."""
    n_turns: int | None = None
    """Model replies."""
    prompt_tokens: int | None = None
    """Tokens sent over the attempt."""
    cached_tokens: int | None = None
    """Of prompt_tokens, those the provider served from its prompt cache (where reported)."""
    completion_tokens: int | None = None
    """Tokens received over the attempt."""
    cost_usd: float | None = None
    """Cost in USD: the provider's where it reports one, else from the price table (cost_source)."""
    cost_source: str | None = None
    """Where cost_usd came from: provider, or price-table:<date> (mkb.agent.prices); None when unknown."""
    dsl_share: float | None = None
    """The final grading's share of solve()'s profiled device time done by the declared DSL (details.dsl_share)."""


class Attempt(Progress):
    """One attempt at a trial, including errored ones that were rerun and replays [attempt_id]."""

    table: ClassVar[str] = "attempts"
    keys: ClassVar[tuple[str, ...]] = ("attempt_id",)
    json_columns: ClassVar[tuple[str, ...]] = ("budget", "usage", "conditions")

    attempt_id: str
    """Id of the attempt."""
    model: str
    """Model id."""
    trial_id: str
    """The trial it is an attempt at."""
    sandbox: str | None = None
    """How the agent's commands were isolated (bwrap, subprocess, docker:<image>)."""
    budget: dict[str, Any] | None = None
    """The budget (Budget fields)."""
    usage: dict[str, Any] | None = None
    """Turns, tokens, reasoning tokens, tool calls, cost (Usage fields)."""
    conditions: dict[str, Any] | None = None
    """Clock, context handling, DSL policy, manuals and sandbox size it ran under (Conditions)."""


class Message(Row):
    """One transcript message in OpenAI wire format, written as it happens [attempt_id, seq]."""

    table: ClassVar[str] = "messages"
    keys: ClassVar[tuple[str, ...]] = ("attempt_id", "seq")
    json_columns: ClassVar[tuple[str, ...]] = ("tool_calls", "extra")

    attempt_id: str
    """The attempt."""
    seq: int
    """Position in the transcript, from 0."""
    role: str
    """system, user, assistant or tool."""
    content: str | None = None
    """The text (non-text content as JSON text)."""
    tool_calls: list[dict[str, Any]] | None = None
    """The assistant's tool calls (wire format)."""
    tool_call_id: str | None = None
    """For tool results: the call answered."""
    name: str | None = None
    """Optional name field of the wire format."""
    prompt_tokens: int | None = None
    """Of an assistant reply: tokens sent."""
    completion_tokens: int | None = None
    """Of an assistant reply: tokens received."""
    extra: dict[str, Any] | None = None
    """Per-message metadata (clock, tool facts, usage details); stripped before each API call."""
    created_at: datetime
    """UTC."""

    def wire(self) -> dict[str, Any]:
        """The message as the model saw it (no metadata)."""
        found = {"role": self.role, "content": self.content, "tool_calls": self.tool_calls,
                 "tool_call_id": self.tool_call_id, "name": self.name}
        return {k: v for k, v in found.items() if v is not None or k == "content"}


class StoredSubmission(Row, Timings):
    """One graded submission of an attempt, feedback or final [attempt_id, n]."""

    table: ClassVar[str] = "submissions"
    keys: ClassVar[tuple[str, ...]] = ("attempt_id", "n")
    json_columns: ClassVar[tuple[str, ...]] = ("record",)

    attempt_id: str
    """The attempt."""
    n: int
    """1-based order; the final grading comes last."""
    kind: Literal["feedback", "final"]
    """feedback (the submit tool) or final (the attempt's result)."""
    status: Status
    """Judge status."""
    kernel_sha256: str | None = None
    """sha256 of the graded kernel.py."""
    kernel_source: str | None = None
    """The graded kernel.py."""
    queue_s: float | None = None
    """Seconds the grading waited for a judge worker."""
    n_correct_draws: int | None = None
    """Correctness draws the kernel got right (of 5)."""
    record: dict[str, Any]
    """The full judge record (JudgeRecord fields)."""
    created_at: datetime
    """UTC."""

    def judge_record(self) -> JudgeRecord:
        """The stored judge record, typed."""
        return JudgeRecord.model_validate(self.record)


class Skill(Row):
    """The SKILL.md one solo attempt left [attempt_id]; a trial's skill is its current attempt's (Store.skill)."""

    table: ClassVar[str] = "skills"
    keys: ClassVar[tuple[str, ...]] = ("attempt_id",)

    attempt_id: str
    """The attempt that wrote it."""
    model: str
    """Model id."""
    trial_id: str
    """The solo trial of that attempt."""
    text: str
    """The skill."""
    sha256: str
    """sha256 of text (UTF-8)."""
    n_chars: int | None = None
    """Length of text in characters."""
    n_words: int | None = None
    """Length of text in words (whitespace-separated)."""
    created_at: datetime
    """UTC."""


class EagerBaseline(Row):
    """The eager reference's time for one problem on one GPU model and environment [fingerprint].

    Measured once, in several fresh trusted processes, by the first final grading that passed there (or by
    `mkb calibrate`), and reused by every grading whose fingerprint matches: all arms of a run compare their
    kernels with one baseline. A changed problem, toolchain, driver, GPU model or timing method changes the
    fingerprint, so the baseline is measured again."""

    table: ClassVar[str] = "eager_baselines"
    keys: ClassVar[tuple[str, ...]] = ("fingerprint",)
    json_columns: ClassVar[tuple[str, ...]] = ("fingerprint_parts", "eager_ms_each")

    fingerprint: str
    """sha256 of fingerprint_parts."""
    problem_id: str
    """e.g. p25."""
    gpu: str
    """GPU model, e.g. NVIDIA H200."""
    timing: str
    """paper or flushed."""
    scale: str
    """full (smoke only in tests)."""
    fingerprint_parts: dict[str, Any]
    """What the figure depends on: problem file, GPU, timing, scale, torch, Python, driver, timing method."""
    eager_ms: float
    """Summary (summary) over processes of each process's median: the baseline."""
    eager_device_ms: float | None = None
    """Median over processes of the reference's profiled device time per call."""
    processes: int
    """Fresh trusted processes it was measured in."""
    summary: str
    """min or median."""
    eager_ms_each: list[float]
    """Each process's median."""
    measured_by: str | None = None
    """The grading that measured it (problem, DSL, trial or command)."""
    created_at: datetime
    """UTC."""


class NoiseFloor(Row):
    """How far identical final gradings of one variant came apart on one GPU: its noise floor [problem_id, dsl,
    gpu, timing]. Written by `mkb calibrate` (the latest calibration replaces the row); the report compares
    paired ratios with max(delta, the problem's floor)."""

    table: ClassVar[str] = "noise_floors"
    keys: ClassVar[tuple[str, ...]] = ("problem_id", "dsl", "gpu", "timing")
    json_columns: ClassVar[tuple[str, ...]] = ("speedups", "kernel_ms_each")

    problem_id: str
    """e.g. p25."""
    dsl: Dsl
    """The variant."""
    gpu: str
    """GPU model."""
    timing: str
    """paper or flushed."""
    kernel: str
    """The kernel graded (a shipped solution's path, or the file given)."""
    kernel_sha256: str
    """sha256 of its source."""
    repeats: int
    """Final gradings of it."""
    processes: int
    """Fresh processes per final grading."""
    summary: str
    """How each final grading summarised its processes (min or median)."""
    speedups: list[float]
    """Each final grading's speedup."""
    kernel_ms_each: list[float]
    """Each final grading's kernel_ms."""
    spread: float
    """max(speedups) / min(speedups) - 1: the floor."""
    created_at: datetime
    """UTC."""


ROWS: tuple[type[Row], ...] = (Run, Trial, Attempt, Message, StoredSubmission, Skill, EagerBaseline, NoiseFloor)
"""Every table written through typed rows."""
