"""The protocol runner: plan a model's trials from the store, run them, record everything (DESIGN §7)."""

from __future__ import annotations

import logging
import signal
import threading
import uuid
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

from mkb import environment
from mkb.agent.budget import Budget
from mkb.agent.sandboxes import check_sandbox
from mkb.agent.prompts import Gpu
from mkb.errors import MkbError
from mkb.problems import catalog_for, select
from mkb.protocol.attempts import ORACLE, make_attempt, oracle_model, solution_path
from mkb.protocol.plan import Action, FingerprintParts, PlanItem, TrialSpec, expand, plan
from mkb.protocol.pool import JudgePool
from mkb.protocol.runner import Progress, ProtocolRun
from mkb.records import Arm
from mkb.settings import Settings
from mkb.store import Store
from mkb.trial import fingerprint_parts, make_executor

log = logging.getLogger(__name__)


@dataclass
class RunRequest:
    """What `mkb run-model` was asked to do."""

    model: str
    problems: list[str] | None = None
    families: list[str] | None = None
    arms: list[Arm] | None = None
    trial_glob: str | None = None
    replicates: int = 1
    concurrency: int = 4
    slots: list[str] | None = None
    rerun_stale: bool = False
    budget: Budget = Budget()
    base_url: str | None = None
    api_key_env: str | None = None
    sampling: dict | None = None
    sandbox: str = "local"
    image: str = "mkb:latest"


def current_parts(settings: Settings, spec: TrialSpec, source_skill: str | None, budget: Budget) -> FingerprintParts:
    """The fingerprint parts a trial would have if it ran now (the same parts `mkb attempt` records)."""
    return FingerprintParts(**fingerprint_parts(spec.problem, spec.arm.dsl, settings, budget,
                                                source_skill if spec.arm.is_skill else None))


def make_plan(settings: Settings, store: Store, request: RunRequest) -> list[PlanItem]:
    """Expand the selection into trials and decide, from the store, what to do with each."""
    problems = select(request.problems, catalog_for(settings.problems_dir), request.families)
    if request.model == ORACLE:
        problems = oracle_problems(settings, problems)
    specs = expand(problems, request.arms or list(Arm), request.replicates, request.trial_glob)
    if not specs:
        raise MkbError("the selection holds no trials. Check --problems, --families, --arms and --trials.")
    stored = {t["trial_id"]: t for t in store.trials(request.model)}
    skills = {s["trial_id"]: s["sha256"] for s in store.rows("SELECT trial_id, sha256 FROM skills WHERE model = ?",
                                                              [request.model])}
    current = {s.trial_id: current_parts(settings, s, skills.get(s.source_trial_id), request.budget) for s in specs}
    return plan(specs, stored, current)


def oracle_problems(settings: Settings, problems: list) -> list:
    """The selected problems the `reference` oracle can attempt: those with a shipped solution in both DSLs.

    The others are left out of the plan (with a warning), never run: the oracle has nothing to submit there."""
    from mkb.records import DSLS

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


def gpu_for_prompt() -> Gpu:
    """The GPU named in the instruction: the first visible one, else the paper's H200."""
    gpus = environment.gpus()
    return Gpu(name=gpus[0]["name"], arch=gpus[0]["arch"]) if gpus else Gpu()


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


def run_model(settings: Settings, store: Store, request: RunRequest, items: list[PlanItem],
              grade: Callable[..., object], executor_for: Callable[[Path], object],
              on_event: Callable[[str, TrialSpec, Progress], None] | None = None,
              on_pool: Callable[[JudgePool], None] | None = None) -> Progress:
    """Run the planned trials of one model; `grade(problem, kernel_path, dsl, device_slot=...)` judges.

    Every trial ends recorded, however it ends; Ctrl-C/SIGTERM mark running attempts interrupted.
    """
    oracle = request.model == ORACLE
    if oracle:
        model_for = lambda spec: oracle_model(spec.problem, spec.arm.dsl, settings.solutions_path)  # noqa: E731
        provider = {"provider": "oracle", "is_oracle": True}
    else:
        from mkb.agent.model import ChatModel, parse_model_spec

        config = parse_model_spec(request.model, request.base_url, request.api_key_env, **(request.sampling or {}))
        config.api_key()  # a missing key fails here, in one line, before anything runs
        model_for = lambda spec: ChatModel(config)  # noqa: E731
        provider = {"provider": config.provider, "base_url": config.base_url, "api_key_env": config.api_key_env,
                    "params": config.model_dump(mode="json", exclude={"api_key_env"})}
    run_id = uuid.uuid4().hex
    facts = environment.describe(with_gpu=True)
    store.start_run(run_id, request.model, versions=facts["versions"], git_commit=facts["git_commit"],
                    host=facts["host"], gpus=facts["gpus"], command="run-model", **provider)
    pool = JudgePool(grade, request.slots or ["cpu"])
    if on_pool:
        on_pool(pool)
    gpu = gpu_for_prompt()

    def grade_for(spec: TrialSpec):
        return lambda kernel_path: pool.grade(spec.problem, kernel_path, spec.arm.dsl, label=spec.trial_id)

    attempt = make_attempt(store, request.model, model_for, request.budget, grade_for, executor_for,
                           settings.home / "workspaces", settings.problems_dir, gpu)
    try:
        return drive(settings, store, request, items, run_id, attempt, on_event)
    finally:
        pool.close()


def drive(settings: Settings, store: Store, request: RunRequest, items: list[PlanItem], run_id: str,
          attempt, on_event=None, around: Callable[[ProtocolRun], object] | None = None) -> Progress:
    """Run the planned trials with any executor's attempt function and record how the run ended.

    `around(runner)` may return a context manager held while the trials run (e.g. a message drainer).
    Ctrl-C/SIGTERM set the cancel flag: running attempts end interrupted and rerun next time.
    """
    skills_sha = lambda spec, sha: current_parts(settings, spec, sha, request.budget)  # noqa: E731
    runner = ProtocolRun(store, request.model, run_id, attempt, skills_sha, request.concurrency, on_event)
    state = "interrupted"
    try:
        with (around(runner) if around else nullcontext()), _stop_on_signals(runner.cancel):
            progress = runner.run(items)
        state = "finished"
        return progress
    except KeyboardInterrupt:
        runner.cancel.set()
        raise
    finally:
        store.finish_run(run_id, state)


def judge_grader(settings, device: str):
    """grade(problem, kernel_path, dsl, device_slot) on the real judge, pinned to the slot's GPU."""
    from mkb.judge import grade

    # CPU mode (tests, machines without a GPU) grades at smoke scale: full scale takes minutes per draw on a CPU
    scale = "smoke" if device == "cpu" else "full"

    def run(problem, kernel_path, dsl, device_slot: str = "cpu"):
        pin = {} if device_slot == "cpu" else {"visible_devices": device_slot}
        return grade(problem, kernel_path, dsl, device=device, settings=settings, scale=scale, **pin)

    return run


def executor_factory(sandbox: str, image: str, settings: Settings):
    """A workspace executor per attempt (bubblewrap on this host, or a Docker container); the sandbox
    hides MKB_HOME, the problem set and the solutions from the agent, as in `mkb attempt`.

    Raises:
        ConfigError: attempts could not open this sandbox here (said once, before any trial starts).
    """
    check_sandbox(sandbox, allow_unsafe=settings.unsafe_sandbox, image=image)
    return lambda workdir: make_executor(sandbox, workdir, settings, image)

__all__ = ["RunRequest", "make_plan", "oracle_problems", "check_stale", "run_model", "drive", "ORACLE"]
