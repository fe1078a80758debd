"""Running a planned protocol: concurrent attempts, skill transfer, every outcome recorded."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from mkb.protocol.plan import Action, FingerprintParts, PlanItem, TrialSpec, fingerprint
from mkb.records import Record
from mkb.store import Store, now

log = logging.getLogger(__name__)


class Outcome(Record):
    """How one attempt ended, as the protocol records it."""

    state: str
    """finished, infra_error, interrupted or skipped."""
    status: str | None = None
    """Judge status of the final grading (None unless graded)."""
    speedup: float | None = None
    """Final speedup when passed."""
    kernel_ms: float | None = None
    """Final kernel time when passed."""
    eager_ms: float | None = None
    """Eager reference time of the final grading."""
    skill_text: str | None = None
    """SKILL.md as the attempt left it (solo arms)."""
    prompt_tokens: int = 0
    """Tokens sent to the model."""
    completion_tokens: int = 0
    """Tokens received from the model."""
    cost_usd: float | None = None
    """Provider cost when known."""
    n_submissions: int = 0
    """Feedback submissions used."""
    n_turns: int = 0
    """Model turns."""
    wall_s: float = 0.0
    """Attempt wall clock, queue time excluded."""
    queue_s: float = 0.0
    """Time spent waiting for a judge worker."""
    message: str = ""
    """Why it ended this way."""


@dataclass
class AttemptContext:
    """What one attempt gets from the protocol besides its trial spec."""

    attempt_id: str
    skill_text: str | None
    on_message: Callable[[int, dict], None]
    cancel: threading.Event


AttemptFn = Callable[[TrialSpec, AttemptContext], Outcome]


@dataclass
class Progress:
    """Live counters for the progress view (the store holds the facts)."""

    total: int
    done: int = 0
    passed: int = 0
    running: dict[str, float] = field(default_factory=dict)
    by_state: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0


class ProtocolRun:
    """Executes plan items for one model, writing each trial's attempt, transcript, skill and outcome."""

    def __init__(self, store: Store, model: str, run_id: str, attempt: AttemptFn,
                 parts: Callable[[TrialSpec, str | None], FingerprintParts], concurrency: int = 4,
                 on_event: Callable[[str, TrialSpec, Progress], None] | None = None):
        self.store, self.model, self.run_id = store, model, run_id
        self.attempt, self.parts = attempt, parts
        self.concurrency = max(1, concurrency)
        self.on_event = on_event or (lambda *a: None)
        self.cancel = threading.Event()
        self.progress = Progress(total=0)

    def run(self, items: list[PlanItem]) -> Progress:
        """Run every item whose action is run/rerun; skill trials start when their source solo ends."""
        todo = [i.spec for i in items if i.action in (Action.RUN, Action.RERUN)]
        self.progress = Progress(total=len(todo))
        waiting = {s.trial_id: s for s in todo if s.source_trial_id in {t.trial_id for t in todo}}
        ready = [s for s in todo if s.trial_id not in waiting]
        running: dict[Future, TrialSpec] = {}
        with ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="attempt") as pool:
            try:
                for spec in ready:
                    running[pool.submit(self._run_trial, spec)] = spec
                while running:
                    done, _ = wait(running, return_when=FIRST_COMPLETED)
                    for fut in done:
                        spec = running.pop(fut)
                        fut.result()
                        for child in [w for w in waiting.values() if w.source_trial_id == spec.trial_id]:
                            del waiting[child.trial_id]
                            if not self.cancel.is_set():
                                running[pool.submit(self._run_trial, child)] = child
            except BaseException:
                self.cancel.set()
                raise
        return self.progress

    def _source_skill(self, spec: TrialSpec) -> dict | None:
        return self.store.skill(self.model, spec.source_trial_id) if spec.source_trial_id else None

    def _run_trial(self, spec: TrialSpec) -> None:
        if self.cancel.is_set():
            return
        skill = self._source_skill(spec)
        skill_sha = skill["sha256"] if skill else None
        parts = self.parts(spec, skill_sha)
        base = {"run_id": self.run_id, "problem_id": spec.problem.id, "replicate": spec.replicate,
                "arm": str(spec.arm), "dsl": str(spec.arm.dsl), "source_trial_id": spec.source_trial_id,
                "fingerprint": fingerprint(parts), "fingerprint_parts": parts.model_dump(mode="json"),
                "skill_sha256": skill_sha}
        if spec.arm.is_skill and (skill is None or not skill["text"].strip()):
            self._record(spec, base, None, Outcome(state="skipped", message="the source solo left no SKILL.md"))
            return
        attempt_id = uuid.uuid4().hex
        self.store.start_attempt(attempt_id, self.model, spec.trial_id, run_id=self.run_id,
                                 fingerprint=base["fingerprint"])
        self.store.upsert_trial(self.model, spec.trial_id, attempt_id=attempt_id, state="running",
                                started_at=now(), **base)
        self.progress.running[spec.trial_id] = time.monotonic()
        self.on_event("start", spec, self.progress)
        ctx = AttemptContext(attempt_id, skill["text"] if skill else None,
                             lambda seq, m: self.store.add_message(attempt_id, seq, m), self.cancel)
        outcome = Outcome(state="interrupted", message="the attempt did not finish")
        try:
            outcome = self.attempt(spec, ctx)
        except Exception as exc:  # one crashing attempt never stops the run: it is an infra error
            log.exception("attempt %s crashed", spec.trial_id)
            outcome = Outcome(state="infra_error", message=f"{type(exc).__name__}: {exc}")
        finally:
            if self.cancel.is_set() and outcome.state == "finished" and outcome.status is None:
                outcome = outcome.model_copy(update={"state": "interrupted"})
            self._record(spec, base, attempt_id, outcome)

    def _record(self, spec: TrialSpec, base: dict[str, Any], attempt_id: str | None, outcome: Outcome) -> None:
        if attempt_id is not None:
            self.store.finish_attempt(attempt_id, outcome.state, outcome.status, message=outcome.message,
                                      usage={"prompt_tokens": outcome.prompt_tokens,
                                             "completion_tokens": outcome.completion_tokens,
                                             "cost_usd": outcome.cost_usd})
        if outcome.skill_text is not None and not spec.arm.is_skill and outcome.state == "finished":
            self.store.put_skill(self.model, spec.trial_id, attempt_id, outcome.skill_text)
        self.store.upsert_trial(
            self.model, spec.trial_id, attempt_id=attempt_id, state=outcome.state, status=outcome.status,
            speedup=outcome.speedup, kernel_ms=outcome.kernel_ms, eager_ms=outcome.eager_ms,
            finished_at=now(), wall_s=outcome.wall_s, queue_s=outcome.queue_s,
            n_submissions=outcome.n_submissions, n_turns=outcome.n_turns, prompt_tokens=outcome.prompt_tokens,
            completion_tokens=outcome.completion_tokens, cost_usd=outcome.cost_usd, message=outcome.message,
            **base)
        p = self.progress
        p.running.pop(spec.trial_id, None)
        p.done += 1
        p.passed += outcome.status == "passed"
        p.by_state[outcome.state] = p.by_state.get(outcome.state, 0) + 1
        p.prompt_tokens += outcome.prompt_tokens
        p.completion_tokens += outcome.completion_tokens
        p.cost_usd += outcome.cost_usd or 0.0
        self.on_event("end", spec, p)
