"""The one writer of a trial's rows: its run, attempts, trial row, transcript, submissions and skill.

`mkb attempt`, `mkb replay` and `mkb run-model` (local and Ray) all record through this module, so the
same attempt leaves the same rows whichever path ran it. Rows are typed (mkb.store.rows) and written
whole; the transcript and submissions go to a sink as they happen (the Store, or a Ray outbox that
forwards them to the driver, the only process that writes the database).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import Field

from mkb.agent import prices
from mkb.agent.budget import Budget, Usage
from mkb.agent.conditions import Conditions
from mkb.agent.feedback import n_correct
from mkb.agent.loop import AttemptResult
from mkb.agent.model import ModelConfig
from mkb.agent.prompts import templates_sha256
from mkb.agent.tools import Submission
from mkb.agent.workspace import docs_sha256
from mkb.environment import Device, describe, toolchain_versions
from mkb.records import Record, State, Status, Timings, TrialSpec
from mkb.settings import Settings
from mkb.store import Attempt, Message, Row, Run, Skill, Store, StoredSubmission, Trial, now
from mkb.store.owner import current_owner


class FingerprintParts(Record):
    """What a trial's result depends on besides the model (DESIGN §7)."""

    problem: str
    """sha256 of the problem file."""
    templates: str
    """sha256 of the agent's prompt templates."""
    docs: str
    """sha256 of the DSL docs given to the agent."""
    toolchain: dict[str, str]
    """Toolchain versions (torch, cutlass-dsl, tvm)."""
    source_skill: str | None = None
    """sha256 of the transferred skill (skill arms only)."""
    budget: dict = {}
    """The attempt budget (wall clock, submissions, caps)."""
    conditions: dict = {}
    """Clock, context handling, DSL policy, manuals and sandbox size (Conditions.recorded)."""

    @property
    def sha256(self) -> str:
        """The trial's fingerprint: sha256 over the canonical JSON of the parts."""
        return sha256_of(self.model_dump(mode="json"))


def sha256_of(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def fingerprint_parts(settings: Settings, spec: TrialSpec, budget: Budget,
                      source_skill: str | None) -> FingerprintParts:
    """The parts a trial has if it runs now; source_skill (the skill's sha256) counts for skill arms only."""
    conditions = Conditions.of(settings)
    return FingerprintParts(problem=spec.problem.fingerprint,
                            templates=templates_sha256(settings.problems_dir / "templates"),
                            docs=docs_sha256(settings.problems_dir, spec.arm.dsl, conditions.manual_examples),
                            toolchain=toolchain_versions(), source_skill=source_skill if spec.arm.is_skill else None,
                            budget=budget.model_dump(mode="json"), conditions=conditions.recorded())


def dsl_share_of(record) -> float | None:
    """details.dsl_share of a judge record, when it is a number (issue #24)."""
    share = (record.details or {}).get("dsl_share") if record is not None else None
    return float(share) if isinstance(share, int | float) and not isinstance(share, bool) else None


class Outcome(Timings):
    """How one attempt ended, as it is recorded; built from an AttemptResult by Outcome.of on every path.

    Its timings are the final grading's."""

    state: State
    """See State."""
    status: Status | None = None
    """Judge status of the final grading (None unless graded)."""
    skill_text: str | None = None
    """SKILL.md as the attempt left it (None when missing or blank)."""
    usage: Usage = Field(default_factory=Usage)
    """Turns, tokens, tool calls, cost."""
    n_submissions: int = 0
    """Feedback submissions charged."""
    wall_s: float = 0.0
    """Agent time: the attempt's wall clock minus the time its gradings waited for a judge."""
    queue_s: float = 0.0
    """Seconds the gradings waited for a judge worker."""
    sandbox: str | None = None
    """How the agent's commands were isolated (bwrap, subprocess, docker:<image>)."""
    message: str = ""
    """Why it ended this way."""
    ending: str | None = None
    """Why the loop stopped (mkb.agent.loop.ENDINGS); None when no loop ran."""
    charged_s: float | None = None
    """Seconds the budget clock charged."""
    total_s: float | None = None
    """The attempt's wall clock, everything included."""
    time_left_s: float | None = None
    """Budget left when the loop stopped."""
    n_correct_draws: int | None = None
    """Correct draws of the final grading."""
    conditions: dict | None = None
    """The conditions the attempt ran under (Conditions.recorded)."""
    dsl_share: float | None = None
    """The final grading's DSL share (its record's details.dsl_share); None when it recorded none."""

    @classmethod
    def of(cls, result: AttemptResult, conditions: Conditions | None = None) -> Outcome:
        """The recorded view of an agent attempt."""
        final = result.final
        return cls(state=State(result.state), status=result.status, speedup=final.speedup if final else None,
                   dsl_share=dsl_share_of(final),
                   kernel_ms=final.kernel_ms if final else None, eager_ms=final.eager_ms if final else None,
                   skill_text=result.skill_text, usage=result.usage, n_submissions=result.n_submissions,
                   wall_s=max(0.0, result.wall_s - result.queue_s), queue_s=result.queue_s, sandbox=result.isolation,
                   message=f"{result.ending}: {result.message}" if result.message else result.ending,
                   ending=result.ending, charged_s=result.charged_s, total_s=result.wall_s,
                   time_left_s=result.time_left_s, n_correct_draws=n_correct(final) if final else None,
                   conditions=conditions.recorded() if conditions else None)


def start_run(store: Store, model: str, *, config: ModelConfig | None, budget: Budget, settings: Settings,
              device: Device, command: str, provider: str | None = None) -> str:
    """Record the start of a run (protocol, single attempt or replay) in one shape on every path; its id.

    config is None for the `reference` oracle (provider 'oracle') and for replays (provider 'replay').
    """
    params = {"model": config.model_dump(mode="json", exclude={"model", "provider", "base_url", "api_key_env"})
              if config else None, "request": config.request_params() if config else None,
              "budget": budget.model_dump(mode="json"), "sandbox": settings.sandbox,
              "image": settings.image if settings.sandbox == "docker" else None, "device": device.kind,
              "scale": device.scale, "conditions": Conditions.of(settings).recorded()}
    facts, owner = describe(with_gpu=False), current_owner()
    run = Run(run_id=uuid.uuid4().hex, model=model, provider=provider or (config.provider if config else "oracle"),
              base_url=config.base_url if config else None, api_key_env=config.api_key_env if config else None,
              is_oracle=config is None and provider is None, params=params, versions=facts["versions"],
              git_commit=facts["git_commit"], host=owner.host, owner_pid=owner.pid, owner_start=owner.start,
              gpus=device.gpus, command=command, started_at=now())
    store.put(run)
    return run.run_id


class Sink(Protocol):
    """Where transcript rows go as they happen: the Store, or a Ray outbox to the driver's Store."""

    def add(self, row: Row) -> None: ...


@dataclass(frozen=True)
class Transcript:
    """Writes one attempt's messages and gradings to a sink, each as it happens."""

    sink: Sink
    attempt_id: str

    def message(self, seq: int, message: dict[str, Any]) -> None:
        """One message in wire format; per-message metadata sits under 'extra'."""
        extra = message.get("extra") or {}
        content = message.get("content")
        self.sink.add(Message(
            attempt_id=self.attempt_id, seq=seq, role=message.get("role", ""),
            content=content if isinstance(content, str | None) else json.dumps(content),
            tool_calls=message.get("tool_calls"), tool_call_id=message.get("tool_call_id"), name=message.get("name"),
            prompt_tokens=extra.get("prompt_tokens"), completion_tokens=extra.get("completion_tokens"), extra=extra,
            created_at=now()))

    def submission(self, s: Submission) -> None:
        """One grading (feedback or final) with its judge record."""
        r = s.record
        self.sink.add(StoredSubmission(
            attempt_id=self.attempt_id, n=s.n, kind=s.kind, status=r.status, speedup=r.speedup,
            kernel_ms=r.kernel_ms, eager_ms=r.eager_ms, kernel_sha256=s.kernel_sha256, kernel_source=s.kernel_source,
            queue_s=s.queue_s, n_correct_draws=n_correct(r), record=r.model_dump(mode="json"), created_at=now()))


@dataclass(frozen=True)
class Recording:
    """An attempt under way: its attempt row and the trial row it will update (None for a replay)."""

    attempt: Attempt
    trial: Trial | None


class Recorder:
    """Writes the attempt, trial and skill rows of one run's trials (the transcript goes through Transcript)."""

    def __init__(self, store: Store, model: str, run_id: str, budget: Budget):
        self.store, self.model, self.run_id, self.budget = store, model, run_id, budget

    def _trial(self, spec: TrialSpec, parts: FingerprintParts, source_trial_id: str | None, state: State,
               attempt_id: str | None, message: str | None = None) -> Trial:
        return Trial(model=self.model, trial_id=spec.trial_id, run_id=self.run_id, attempt_id=attempt_id,
                     problem_id=spec.problem.id, replicate=spec.replicate, arm=spec.arm, dsl=spec.arm.dsl,
                     source_trial_id=source_trial_id, state=state, fingerprint=parts.sha256,
                     fingerprint_parts=parts.model_dump(mode="json"), skill_sha256=parts.source_skill,
                     started_at=now(), message=message)

    def skip(self, spec: TrialSpec, parts: FingerprintParts, source_trial_id: str | None, why: str) -> None:
        """A skill trial that makes no attempt (its source left no SKILL.md): recorded as skipped."""
        trial = self._trial(spec, parts, source_trial_id, State.SKIPPED, None, why)
        self.store.put(trial.model_copy(update={"finished_at": trial.started_at}))

    def begin(self, spec: TrialSpec, parts: FingerprintParts, source_trial_id: str | None = None, *,
              replay_of: str | None = None) -> Recording:
        """Record that an attempt began (state running); a replay leaves the trial row alone."""
        attempt = Attempt(attempt_id=uuid.uuid4().hex, model=self.model, trial_id=spec.trial_id, run_id=self.run_id,
                          state=State.RUNNING, fingerprint=parts.sha256, budget=self.budget.model_dump(mode="json"),
                          message=f"replay of {replay_of}" if replay_of else None, started_at=now())
        trial = None if replay_of else self._trial(spec, parts, source_trial_id, State.RUNNING, attempt.attempt_id)
        self.store.put(*[row for row in (attempt, trial) if row is not None])
        return Recording(attempt, trial)

    def end(self, recording: Recording, outcome: Outcome) -> None:
        """Close the attempt and, unless it is a replay, the trial; a finished solo's SKILL.md becomes its skill."""
        finished, attempt = now(), recording.attempt
        message = f"{attempt.message}: {outcome.message}" if attempt.message else outcome.message
        rows: list[Row] = [attempt.model_copy(update={
            "state": outcome.state, "status": outcome.status, "sandbox": outcome.sandbox,
            "usage": outcome.usage.model_dump(mode="json"), "conditions": outcome.conditions, "message": message,
            "finished_at": finished})]
        arm = recording.trial.arm if recording.trial else None
        if outcome.skill_text is not None and arm is not None and not arm.is_skill:
            rows.append(_skill(attempt, outcome.skill_text))
        trial = recording.trial
        if trial is not None:
            usage = outcome.usage
            cost_usd, cost_source = prices.cost(self.model, usage)
            rows.append(trial.model_copy(update={
                "state": outcome.state, "status": outcome.status, "speedup": outcome.speedup,
                "kernel_ms": outcome.kernel_ms, "eager_ms": outcome.eager_ms, "dsl_share": outcome.dsl_share,
                "finished_at": finished,
                "wall_s": outcome.wall_s, "queue_s": outcome.queue_s, "charged_s": outcome.charged_s,
                "total_s": outcome.total_s, "time_left_s": outcome.time_left_s, "ending": outcome.ending,
                "timed_out": outcome.ending == "time" if outcome.ending else None, "n_handoffs": usage.n_handoffs,
                "n_correct_draws": outcome.n_correct_draws, "n_submissions": outcome.n_submissions,
                "n_turns": usage.n_turns, "prompt_tokens": usage.prompt_tokens, "cached_tokens": usage.cached_tokens,
                "completion_tokens": usage.completion_tokens, "cost_usd": cost_usd, "cost_source": cost_source,
                "message": outcome.message}))
        self.store.put(*rows)


def _skill(attempt: Attempt, text: str) -> Skill:
    """The SKILL.md one solo attempt left, kept under that attempt: a trial's skill is its current attempt's, so a
    rerun that writes none never passes on an older attempt's (Store.skill)."""
    return Skill(attempt_id=attempt.attempt_id, model=attempt.model, trial_id=attempt.trial_id, text=text,
                 sha256=hashlib.sha256(text.encode()).hexdigest(), n_chars=len(text), n_words=len(text.split()),
                 created_at=now())
