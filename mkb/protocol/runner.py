"""Running a planned protocol: concurrent attempts, skill transfer, every outcome recorded (mkb.trial writes)."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from mkb.protocol.plan import Action, PlanItem
from mkb.records import State, Status, TrialSpec
from mkb.store import Store
from mkb.trial import FingerprintParts, Outcome, Recorder

log = logging.getLogger(__name__)

NO_SKILL = "the source solo left no SKILL.md"


def usable_source(state: State | None, status: Status | None) -> bool:
    """A source solo whose skill may be transferred: it finished and its final grading was not lost to the
    infrastructure (otherwise it reruns, and so does its skill trial, from the rerun's skill)."""
    return state == State.FINISHED and status != Status.INFRA_ERROR


@dataclass
class AttemptContext:
    """What one attempt gets from the protocol besides its trial spec."""

    attempt_id: str
    skill_text: str | None
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

    def count(self, outcome: Outcome) -> None:
        """One trial ended."""
        self.done += 1
        self.passed += outcome.status == Status.PASSED
        self.by_state[outcome.state] = self.by_state.get(outcome.state, 0) + 1
        self.prompt_tokens += outcome.usage.prompt_tokens
        self.completion_tokens += outcome.usage.completion_tokens
        self.cost_usd += outcome.usage.cost_usd or 0.0


class ProtocolRun:
    """Executes plan items for one model; a skill trial starts once its source solo has finished.

    given_skills maps trial ids to a skill text given from outside (`mkb attempt --skill`), used
    instead of the source solo's stored skill.
    """

    def __init__(self, store: Store, recorder: Recorder, attempt: AttemptFn,
                 parts: Callable[[TrialSpec, str | None], FingerprintParts], concurrency: int = 4,
                 on_event: Callable[[str, TrialSpec, Progress], None] | None = None,
                 given_skills: dict[str, str] | None = None):
        self.store, self.recorder, self.attempt, self.parts = store, recorder, attempt, parts
        self.concurrency = max(1, concurrency)
        self.on_event = on_event or (lambda *a: None)
        self.given_skills = given_skills or {}
        self.cancel = threading.Event()
        self.progress = Progress(total=0)

    def run(self, items: list[PlanItem]) -> Progress:
        """Run every item whose action is run/rerun; a skill trial starts once its source solo finished (a source
        that did not finish holds it, unrecorded, for the next run)."""
        todo = [i.spec for i in items if i.action in (Action.RUN, Action.RERUN)]
        self.progress = Progress(total=len(todo))
        waiting = {s.trial_id: s for s in todo if s.source_trial_id in {t.trial_id for t in todo}}
        running: dict[Future, TrialSpec] = {}
        with ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="attempt") as pool:
            try:
                for spec in [s for s in todo if s.trial_id not in waiting]:
                    running[pool.submit(self._run_trial, spec)] = spec
                while running:
                    done, _ = wait(running, return_when=FIRST_COMPLETED)
                    for fut in done:
                        spec, ended = running.pop(fut), fut.result()
                        for child in [w for w in waiting.values() if w.source_trial_id == spec.trial_id]:
                            del waiting[child.trial_id]
                            if ended is not None and usable_source(*ended) and not self.cancel.is_set():
                                running[pool.submit(self._run_trial, child)] = child
                            elif ended is not None:
                                self._hold(child, spec.trial_id, ended)
            except BaseException:
                self.cancel.set()
                raise
        return self.progress

    def _hold(self, child: TrialSpec, source: str, ended: tuple[State, Status | None]) -> None:
        """A skill trial whose source did not finish is neither run nor recorded: the next run reruns both."""
        how = ended[0] if ended[1] != Status.INFRA_ERROR else "with an infra_error grading"
        log.warning("%s not run: its source %s ended %s; the next run reruns both", child.trial_id, source, how)
        self.progress.total -= 1

    def _skill(self, spec: TrialSpec) -> tuple[str | None, str | None]:
        """The skill text this trial gets and the trial it came from (None when given from outside): the
        SKILL.md of the source's current attempt, never an earlier attempt's."""
        if spec.trial_id in self.given_skills:
            return self.given_skills[spec.trial_id], None
        if not spec.arm.is_skill:
            return None, None
        stored = self.store.skill(self.recorder.model, spec.source_trial_id)
        return (stored.text if stored else None), spec.source_trial_id

    def _source_finished(self, spec: TrialSpec) -> bool:
        if not spec.arm.is_skill or spec.trial_id in self.given_skills:
            return True
        source = self.store.trial(self.recorder.model, spec.source_trial_id)
        return source is not None and usable_source(source.state, source.status)

    def _run_trial(self, spec: TrialSpec) -> tuple[State, Status | None] | None:
        if self.cancel.is_set():
            return None
        if not self._source_finished(spec):
            log.warning("%s not run: its source %s has not finished; run it first", spec.trial_id,
                        spec.source_trial_id)
            self.progress.total -= 1
            return None
        text, source = self._skill(spec)
        parts = self.parts(spec, hashlib.sha256(text.encode()).hexdigest() if text is not None else None)
        if spec.arm.is_skill and not (text or "").strip():
            self.recorder.skip(spec, parts, source, NO_SKILL)
            return self._ended(spec, Outcome(state=State.SKIPPED, message=NO_SKILL)), None
        recording = self.recorder.begin(spec, parts, source)
        self.progress.running[spec.trial_id] = time.monotonic()
        self.on_event("start", spec, self.progress)
        outcome = Outcome(state=State.INTERRUPTED, message="the attempt did not finish")
        try:
            outcome = self.attempt(spec, AttemptContext(recording.attempt.attempt_id, text, self.cancel))
        except Exception as exc:  # one crashing attempt never stops the run: it is an infra error
            log.exception("attempt %s crashed", spec.trial_id)
            outcome = Outcome(state=State.INFRA_ERROR, message=f"{type(exc).__name__}: {exc}")
        finally:
            if self.cancel.is_set() and outcome.state == State.FINISHED and outcome.status is None:
                outcome = outcome.model_copy(update={"state": State.INTERRUPTED})
            self.recorder.end(recording, outcome)
            self._ended(spec, outcome)
        return outcome.state, outcome.status

    def _ended(self, spec: TrialSpec, outcome: Outcome) -> State:
        self.progress.running.pop(spec.trial_id, None)
        self.progress.count(outcome)
        self.on_event("end", spec, self.progress)
        return outcome.state
