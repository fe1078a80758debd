"""One recorded attempt: prepare its workspace, run the agent, write everything to the store; and replays."""

from __future__ import annotations

import hashlib
import json
import logging
import shlex
import sys
import uuid
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from mkb import environment
from mkb.agent import (AttemptResult, Budget, Gpu, LocalExecutor, ModelConfig, ScriptedModel, Submission,
                       docs_sha256, prepare_workspace, run_attempt, templates_sha256)
from mkb.agent.executor import Executor
from mkb.agent.model import Model
from mkb.agent.prompts import toolchain_versions
from mkb.agent.tools import Grade
from mkb.errors import MkbError
from mkb.problems import catalog_for, resolve
from mkb.records import Arm, Dsl, ProblemInfo, trial_id
from mkb.settings import Settings
from mkb.store import Store, now

log = logging.getLogger(__name__)

SANDBOXES = ("local", "docker", "none")
"""local: bubblewrap; docker: a container; none: no isolation. Unisolated commands need MKB_UNSAFE_SANDBOX."""


def arm_for(dsl: Dsl, with_skill: bool) -> Arm:
    """The arm of a single attempt: solo, or the skill arm that targets dsl."""
    if not with_skill:
        return Arm(f"solo_{dsl}")
    return Arm.CUTEDSL2TIRX_SKILL if dsl == Dsl.TIRX else Arm.TIRX2CUTEDSL_SKILL


def make_executor(sandbox: str, workspace: Path, settings: Settings, image: str) -> Executor:
    """The executor for a sandbox kind (local: bubblewrap; docker: a container; none: no isolation)."""
    if sandbox == "docker":
        from mkb.agent.docker_executor import DockerExecutor

        return DockerExecutor(workspace, image)
    return LocalExecutor(workspace, isolate=sandbox == "local", allow_unsafe=settings.unsafe_sandbox,
                         hide=(settings.home, settings.problems_dir, settings.solutions_path))


def fingerprint_parts(problem: ProblemInfo, dsl: Dsl, settings: Settings, budget: Budget,
                      skill_sha256: str | None) -> dict[str, Any]:
    """What the attempt's result depends on besides the model (DESIGN §7): the same parts, hashed the same
    way, as mkb.protocol's plan, so run-model can reuse a trial recorded by `mkb attempt`."""
    return {"problem": problem.fingerprint, "templates": templates_sha256(settings.problems_dir / "templates"),
            "docs": docs_sha256(settings.problems_dir, dsl), "toolchain": toolchain_versions(),
            "source_skill": skill_sha256, "budget": budget.model_dump(mode="json")}


def _sha256(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


@dataclass
class Recorded:
    """A stored attempt: where to find it, and what happened."""

    trial_id: str
    attempt_id: str
    result: AttemptResult


def run_trial(store: Store, settings: Settings, problem: ProblemInfo, dsl: Dsl, config: ModelConfig, model: Model, *,
              grade: Grade, budget: Budget = Budget(), skill_text: str | None = None, sandbox: str = "local",
              image: str = "mkb:latest", gpu: Gpu = Gpu()) -> Recorded:
    """Run one attempt and store it: run, attempt, messages, submissions, skill and the trial row.

    The transcript and submissions are written as they happen; the closing rows are written in
    `finally`, so an interrupted attempt is recorded as such.
    """
    arm = arm_for(dsl, skill_text is not None)
    tid, run_id, attempt_id = trial_id(problem.id, 1, arm), uuid.uuid4().hex, uuid.uuid4().hex
    skill_sha = hashlib.sha256(skill_text.encode()).hexdigest() if skill_text is not None else None
    parts = fingerprint_parts(problem, dsl, settings, budget, skill_sha)
    workspace = prepare_workspace(problem, dsl, settings.home / "attempts" / attempt_id / "workspace",
                                  settings.problems_dir)
    executor = make_executor(sandbox, workspace, settings, image)
    store.start_run(run_id, config.spec, provider=config.provider, base_url=config.base_url,
                    api_key_env=config.api_key_env, params=_params(config, budget), versions=environment.versions(),
                    git_commit=environment.git_commit(), host=environment.describe(with_gpu=False)["host"],
                    command=shlex.join(sys.argv))
    store.start_attempt(attempt_id, config.spec, tid, run_id=run_id, fingerprint=_sha256(parts),
                        sandbox=executor.isolation, budget=budget.model_dump(mode="json"))
    store.upsert_trial(config.spec, tid, run_id=run_id, attempt_id=attempt_id, problem_id=problem.id, replicate=1,
                       arm=str(arm), dsl=str(dsl), state="running", fingerprint=_sha256(parts),
                       fingerprint_parts=parts, skill_sha256=skill_sha, started_at=now())
    result = None
    try:
        result = run_attempt(problem, dsl, model, executor, budget, grade=grade,
                             on_message=partial(store.add_message, attempt_id),
                             on_submission=partial(_store_submission, store, attempt_id), skill_text=skill_text,
                             gpu=gpu, problems_dir=settings.problems_dir)
    finally:
        executor.close()
        _record_end(store, config.spec, tid, run_id, attempt_id, result)
    return Recorded(tid, attempt_id, result)


def _params(config: ModelConfig, budget: Budget) -> dict[str, Any]:
    return {**config.model_dump(mode="json", exclude={"model", "provider", "base_url", "api_key_env"}),
            "request": config.request_params(), "budget": budget.model_dump(mode="json")}


def _store_submission(store: Store, attempt_id: str, s: Submission) -> None:
    store.add_submission(attempt_id, s.n, s.kind, s.record, kernel_source=s.kernel_source,
                         kernel_sha256=s.kernel_sha256, queue_s=s.queue_s)


def _record_end(store: Store, model: str, tid: str | None, run_id: str, attempt_id: str,
                result: AttemptResult | None) -> None:
    if result is None:
        store.finish_attempt(attempt_id, "interrupted", None, message="the attempt did not finish")
        if tid:
            store.upsert_trial(model, tid, state="interrupted", finished_at=now(), message="the attempt did not finish")
        store.finish_run(run_id, "interrupted")
        return
    usage = result.usage.model_dump()
    store.finish_attempt(attempt_id, result.state, result.status, usage=usage, message=result.message)
    if tid:
        final = result.final
        store.upsert_trial(model, tid, state=result.state, status=result.status, speedup=result.speedup,
                           kernel_ms=final.kernel_ms if final else None, eager_ms=final.eager_ms if final else None,
                           finished_at=now(), wall_s=result.wall_s, queue_s=result.queue_s,
                           n_submissions=result.n_submissions, n_turns=result.usage.n_turns,
                           prompt_tokens=result.usage.prompt_tokens, completion_tokens=result.usage.completion_tokens,
                           cost_usd=result.usage.cost_usd, message=result.message)
        if result.skill_text is not None and result.state == "finished":
            store.put_skill(model, tid, attempt_id, result.skill_text)
    store.finish_run(run_id, result.state)


def find_attempt(store: Store, key: str) -> dict[str, Any]:
    """An attempt row by attempt id (or a unique prefix), or a trial id's current attempt.

    Raises:
        MkbError: nothing matches, or a prefix is ambiguous.
    """
    trial = store.rows("SELECT attempt_id FROM trials WHERE trial_id = ? AND attempt_id IS NOT NULL "
                       "ORDER BY started_at DESC NULLS LAST LIMIT 1", [key])
    found = store.rows("SELECT * FROM attempts WHERE attempt_id = ?", [trial[0]["attempt_id"]]) if trial else \
        store.rows("SELECT * FROM attempts WHERE attempt_id LIKE ? ORDER BY started_at", [key + "%"])
    if not found:
        raise MkbError(f"no trial or attempt '{key}' in {store.path}. List them with "
                       f"mkb db query \"SELECT trial_id, attempt_id, state, status FROM attempts\".")
    if len(found) > 1:
        raise MkbError(f"'{key}' matches {len(found)} attempts; give more of the attempt id.")
    return found[0]


def recorded_replies(store: Store, attempt_id: str) -> list[dict[str, Any]]:
    """The assistant messages of a stored attempt, in wire format."""
    replies = []
    for m in store.messages(attempt_id):
        if m["role"] == "assistant":
            calls = json.loads(m["tool_calls"]) if isinstance(m["tool_calls"], str) else m["tool_calls"]
            replies.append({"role": "assistant", "content": m["content"], "tool_calls": calls or []})
    return replies


def replay(store: Store, settings: Settings, key: str, *, grade_for, sandbox: str = "local",
           image: str = "mkb:latest", gpu: Gpu = Gpu()) -> tuple[dict[str, Any], Recorded]:
    """Re-run a stored attempt's tool calls in a fresh workspace against the current toolchain and judge.

    The replay is stored as a new attempt of the same trial (its trial row is left alone).
    grade_for(problem, dsl) returns the grade callable. Returns (the original attempt row, the replay).
    """
    original = find_attempt(store, key)
    trial = store.rows("SELECT * FROM trials WHERE model = ? AND trial_id = ?", [original["model"], original["trial_id"]])
    if not trial:
        raise MkbError(f"attempt {original['attempt_id']} has no trial row; cannot tell its problem and DSL.")
    problem = resolve(trial[0]["problem_id"], catalog_for(settings.problems_dir))
    dsl = Dsl(trial[0]["dsl"])
    skill = store.skill(original["model"], trial[0]["source_trial_id"]) if trial[0]["source_trial_id"] else None
    budget = Budget(**{**(json.loads(original["budget"]) if original["budget"] else {}), "wall_s": None})
    run_id, attempt_id = uuid.uuid4().hex, uuid.uuid4().hex
    workspace = prepare_workspace(problem, dsl, settings.home / "attempts" / attempt_id / "workspace",
                                  settings.problems_dir)
    executor = make_executor(sandbox, workspace, settings, image)
    store.start_run(run_id, original["model"], provider="replay", versions=environment.versions(),
                    git_commit=environment.git_commit(), command=shlex.join(sys.argv))
    store.start_attempt(attempt_id, original["model"], original["trial_id"], run_id=run_id,
                        sandbox=executor.isolation, budget=budget.model_dump(mode="json"),
                        message=f"replay of {original['attempt_id']}")
    result = None
    try:
        result = run_attempt(problem, dsl, ScriptedModel(recorded_replies(store, original["attempt_id"])), executor,
                             budget, grade=grade_for(problem, dsl), on_message=partial(store.add_message, attempt_id),
                             on_submission=partial(_store_submission, store, attempt_id),
                             skill_text=skill["text"] if skill else None, gpu=gpu, problems_dir=settings.problems_dir)
    finally:
        executor.close()
        _record_end(store, original["model"], None, run_id, attempt_id, result)
    if result is not None:
        store.finish_attempt(attempt_id, result.state, result.status, usage=result.usage.model_dump(),
                             message=f"replay of {original['attempt_id']}: {result.message}")
    return original, Recorded(original["trial_id"], attempt_id, result)
