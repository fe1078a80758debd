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
    """Host name of the driver."""
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
    n_submissions: int | None = None
    """Feedback submissions charged (<= the budget's)."""
    n_turns: int | None = None
    """Model replies."""
    prompt_tokens: int | None = None
    """Tokens sent over the attempt."""
    completion_tokens: int | None = None
    """Tokens received over the attempt."""
    cost_usd: float | None = None
    """Provider-reported cost, where reported."""
    dsl_share: float | None = None
    """The final grading's share of solve()'s profiled device time done by the declared DSL (details.dsl_share)."""


class Attempt(Progress):
    """One attempt at a trial, including errored ones that were rerun and replays [attempt_id]."""

    table: ClassVar[str] = "attempts"
    keys: ClassVar[tuple[str, ...]] = ("attempt_id",)
    json_columns: ClassVar[tuple[str, ...]] = ("budget", "usage")

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
    record: dict[str, Any]
    """The full judge record (JudgeRecord fields)."""
    created_at: datetime
    """UTC."""

    def judge_record(self) -> JudgeRecord:
        """The stored judge record, typed."""
        return JudgeRecord.model_validate(self.record)


class Skill(Row):
    """The SKILL.md a solo trial's current attempt left [model, trial_id]."""

    table: ClassVar[str] = "skills"
    keys: ClassVar[tuple[str, ...]] = ("model", "trial_id")

    model: str
    """Model id."""
    trial_id: str
    """The solo trial that wrote it."""
    attempt_id: str | None = None
    """The attempt that wrote it."""
    text: str
    """The skill."""
    sha256: str
    """sha256 of text (UTF-8)."""
    created_at: datetime
    """UTC."""


ROWS: tuple[type[Row], ...] = (Run, Trial, Attempt, Message, StoredSubmission, Skill)
"""Every table written through typed rows."""
