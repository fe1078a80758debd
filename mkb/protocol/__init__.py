"""The protocol runner: plan a model's trials from the store, run them, record everything (DESIGN §7).

execute() is the one wiring of a run (`mkb run-model`, `mkb attempt`, `mkb reproduce`): the judge pool
or the Ray judges, the sandboxes, the model, and the run, attempt and trial rows through mkb.trial.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

from mkb.agent.budget import Budget
from mkb.agent.sandboxes import check_sandbox
from mkb.environment import Device, resolve_device
from mkb.errors import MkbError
from mkb.problems import catalog_for, select
from mkb.protocol.attempts import ORACLE, gpu_named, make_attempt, model_config, model_factory, solution_path
from mkb.protocol.plan import Action, PlanItem, expand, plan
from mkb.protocol.pool import JudgePool
from mkb.protocol.runner import Progress, ProtocolRun
from mkb.records import DSLS, Arm, State, TrialSpec
from mkb.settings import Settings
from mkb.store import Store
from mkb.trial import Recorder, fingerprint_parts, start_run

log = logging.getLogger(__name__)


@dataclass
class RunRequest:
    """What a run was asked to do (`mkb run-model`, or the one trial of `mkb attempt`)."""

    model: str
    problems: list[str] | None = None
    families: list[str] | None = None
    arms: list[Arm] | None = None
    trial_glob: str | None = None
    replicates: int = 1
    concurrency: int = 4
    slots: list[str] | None = None
    """Judge workers (GPU indices); default one per GPU of the device, or 'cpu'."""
    rerun_stale: bool = False
    budget: Budget = Budget()
    base_url: str | None = None
    api_key_env: str | None = None
    sampling: dict | None = None
    command: str = "run-model"
    """The command line, as the run row records it."""


def make_plan(settings: Settings, store: Store, request: RunRequest) -> list[PlanItem]:
    """Expand the selection into trials and decide, from the store, what to do with each."""
    problems = select(request.problems, catalog_for(settings.problems_dir), request.families)
    if request.model == ORACLE:
        problems = oracle_problems(settings, problems)
    specs = expand(problems, request.arms or list(Arm), request.replicates, request.trial_glob)
    if not specs:
        raise MkbError("the selection holds no trials. Check --problems, --families, --arms and --trials.")
    stored = {t.trial_id: t for t in store.trials(request.model)}
    skills = {s.trial_id: s.sha256 for s in store.current_skills(request.model)}
    current = {s.trial_id: fingerprint_parts(settings, s, request.budget, skills.get(s.source_trial_id))
               for s in specs}
    return plan(specs, stored, current)


def oracle_problems(settings: Settings, problems: list) -> list:
    """The selected problems the `reference` oracle can attempt: those with a shipped solution in both DSLs.

    The others are left out of the plan (with a warning), never run: the oracle has nothing to submit there."""

    def solved(problem) -> bool:
        return all(solution_path(settings.solutions_path, problem, d).exists() for d in DSLS)

    covered = [p for p in problems if solved(p)]
    left_out = [p.id for p in problems if p not in covered]
    if not covered:
        every = [p.id for p in catalog_for(settings.problems_dir) if solved(p)]
        raise MkbError(f"the reference oracle has no shipped solution for {', '.join(left_out[:8])}"
                       f"{' ...' if len(left_out) > 8 else ''}; it covers {', '.join(every) or 'no problem'}. "
                       f"Choose --problems among those.")
    if left_out:
        log.warning("the reference oracle covers %d of the %d selected problems (shipped solutions in both DSLs); "
                    "left out: %s", len(covered), len(problems), ", ".join(left_out))
    return covered


def check_stale(items: list[PlanItem], rerun_stale: bool) -> list[PlanItem]:
    """Turn stale items into reruns when allowed; otherwise refuse with a one-line error."""
    stale = [i for i in items if i.action == Action.STALE]
    if stale and not rerun_stale:
        reasons = sorted({i.reason for i in stale})
        raise MkbError(f"{len(stale)} trials are stale ({'; '.join(reasons)[:200]}). "
                       f"Rerun with --rerun-stale, or see them with --dry-run.")
    return [i.model_copy(update={"action": Action.RERUN}) if i.action == Action.STALE else i for i in items]


def execute(settings: Settings, store: Store, request: RunRequest, items: list[PlanItem], *,
            ray=None, grade: Callable | None = None, on_event: Callable | None = None,
            on_pool: Callable | None = None, given_skills: dict[str, str] | None = None) -> Progress:
    """Run the planned trials on this host, or on a Ray cluster when ray (RayOptions) is given.

    grade(problem, kernel_path, dsl, device_slot=...) defaults to the real judge on settings' device.
    Every trial ends recorded, however it ends; Ctrl-C/SIGTERM mark running attempts interrupted.
    """
    if ray is not None:
        from mkb.protocol.ray_executor import run_model_ray

        return run_model_ray(settings, store, request, items, ray, grade=grade, on_event=on_event, on_pool=on_pool,
                             given_skills=given_skills)
    check_sandbox(settings.sandbox, allow_unsafe=settings.unsafe_sandbox, image=settings.image)  # once, before any trial
    device = resolve_device(settings)
    config = model_config(request.model, request.base_url, request.api_key_env, request.sampling,
                          retry_s=settings.model_retry_s)
    run_id = start_run(store, request.model, config=config, budget=request.budget, settings=settings, device=device,
                       command=request.command)
    pool = JudgePool(grade or judge_grader(settings, device), request.slots or device.slots)
    if on_pool:
        on_pool(pool)

    def grade_for(spec: TrialSpec):
        return lambda kernel_path: pool.grade(spec.problem, kernel_path, spec.arm.dsl, label=spec.trial_id)

    attempt = make_attempt(store, request.model, model_factory(config, settings.solutions_path), request.budget,
                           grade_for, settings, gpu_named(device))
    try:
        return drive(settings, store, request, items, run_id, attempt, on_event, given_skills=given_skills)
    finally:
        pool.close()


@contextmanager
def _stop_on_signals(cancel: threading.Event):
    """SIGTERM sets the cancel flag like Ctrl-C: running attempts end as interrupted and rerun next time."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum, frame):
        cancel.set()
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def drive(settings: Settings, store: Store, request: RunRequest, items: list[PlanItem], run_id: str,
          attempt, on_event=None, around: Callable[[ProtocolRun], object] | None = None,
          given_skills: dict[str, str] | None = None) -> Progress:
    """Run the planned trials with any executor's attempt function and record how the run ended.

    `around(runner)` may return a context manager held while the trials run (e.g. a message drainer).
    Ctrl-C/SIGTERM set the cancel flag: running attempts end interrupted and rerun next time.
    """
    parts = lambda spec, sha: fingerprint_parts(settings, spec, request.budget, sha)  # noqa: E731
    runner = ProtocolRun(store, Recorder(store, request.model, run_id, request.budget), attempt, parts,
                         request.concurrency, on_event, given_skills)
    state = State.INTERRUPTED
    try:
        with (around(runner) if around else nullcontext()), _stop_on_signals(runner.cancel):
            progress = runner.run(items)
        state = State.FINISHED
        return progress
    except KeyboardInterrupt:
        runner.cancel.set()
        raise
    finally:
        store.finish_run(run_id, state)


def judge_grader(settings: Settings, device: Device):
    """grade(problem, kernel_path, dsl, device_slot) on the real judge, pinned to the slot's GPU; on the CPU
    at smoke scale (full scale takes minutes per draw on a CPU)."""
    from mkb.judge import grade

    def run(problem, kernel_path, dsl, device_slot: str = "cpu"):
        pin = {} if device_slot == "cpu" else {"visible_devices": device_slot}
        return grade(problem, kernel_path, dsl, device=device.kind, settings=settings, scale=device.scale, **pin)

    return run


__all__ = ["ORACLE", "RunRequest", "check_stale", "drive", "execute", "judge_grader", "make_plan",
           "oracle_problems"]
