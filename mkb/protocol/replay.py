"""Replays: re-run a stored attempt's tool calls in a fresh workspace without a model, and re-grade them.

A replay is stored as a new attempt of the same trial, through the same writer and attempt function as
every other attempt; the trial row is left alone.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from typing import Any

from mkb.agent.budget import Budget
from mkb.agent.model import ScriptedModel
from mkb.environment import resolve_device
from mkb.errors import MkbError
from mkb.problems import catalog_for, resolve
from mkb.protocol import judge_grader
from mkb.protocol.attempts import gpu_named, make_attempt
from mkb.protocol.pool import JudgePool
from mkb.protocol.runner import AttemptContext
from mkb.records import State, TrialSpec
from mkb.settings import Settings
from mkb.store import Attempt, Skill, Store
from mkb.trial import Outcome, Recorder, fingerprint_parts, start_run


def recorded_replies(store: Store, attempt_id: str) -> list[dict[str, Any]]:
    """The assistant messages of a stored attempt, in wire format."""
    return [{"role": "assistant", "content": m.content, "tool_calls": m.tool_calls or []}
            for m in store.messages(attempt_id) if m.role == "assistant"]


def _given_skill(store: Store, model: str, trial) -> Skill | None:
    """The skill the trial was given (its recorded sha256), else its source's current one."""
    given = store.select(Skill, "model = ? AND trial_id = ? AND sha256 = ?",
                         [model, trial.source_trial_id, trial.skill_sha256]) if trial.skill_sha256 else []
    return given[0] if given else store.skill(model, trial.source_trial_id)


def replay(store: Store, settings: Settings, key: str, *, command: str = "replay",
           grade: Callable | None = None) -> tuple[Attempt, Attempt]:
    """Replay the attempt `key` names (an attempt id or prefix, or a trial's current attempt).

    grade(problem, kernel_path, dsl, device_slot=...) defaults to the real judge on settings' device.
    Returns the original attempt and the replay's, both as stored.

    Raises:
        MkbError: nothing matches key, or the attempt's trial row is gone.
    """
    original = store.find_attempt(key)
    trial = store.trial(original.model, original.trial_id)
    if trial is None:
        raise MkbError(f"attempt {original.attempt_id} has no trial row; cannot tell its problem and DSL.")
    spec = TrialSpec(problem=resolve(trial.problem_id, catalog_for(settings.problems_dir)),
                     replicate=trial.replicate, arm=trial.arm)
    skill = _given_skill(store, original.model, trial) if trial.source_trial_id else None
    budget = Budget(**{**(original.budget or {}), "wall_s": None})  # the clock of a replay means nothing
    device = resolve_device(settings)
    run_id = start_run(store, original.model, config=None, budget=budget, settings=settings, device=device,
                       command=command, provider="replay")
    recorder = Recorder(store, original.model, run_id, budget)
    sha = hashlib.sha256(skill.text.encode()).hexdigest() if skill else None
    recording = recorder.begin(spec, fingerprint_parts(settings, spec, budget, sha), replay_of=original.attempt_id)
    pool = JudgePool(grade or judge_grader(settings, device), device.slots)
    replies = recorded_replies(store, original.attempt_id)
    attempt = make_attempt(store, original.model, lambda s: ScriptedModel(replies), budget,
                           lambda s: (lambda path: pool.grade(s.problem, path, s.arm.dsl, label=s.trial_id)),
                           settings, gpu_named(device))
    outcome = Outcome(state=State.INTERRUPTED, message="the replay did not finish")
    try:
        outcome = attempt(spec, AttemptContext(recording.attempt.attempt_id, skill.text if skill else None,
                                               threading.Event()))
    finally:
        pool.close()
        recorder.end(recording, outcome)
        store.finish_run(run_id, State.FINISHED if outcome.state == State.FINISHED else State.INTERRUPTED)
    return original, store.find_attempt(recording.attempt.attempt_id)
