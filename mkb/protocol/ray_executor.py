"""Scale-out on Ray: attempts as Ray tasks, judge evaluations on one-GPU actors, the driver the only writer.

The driver plans from the store and runs the same ProtocolRun and writer (mkb.trial) as the local executor.
Each attempt is a Ray task (CPU) running make_attempt on whichever node Ray picks. Its transcript rows reach
the driver through ray_channel, and its gradings go to ray_judges. A lost worker or node ends its attempt as an
infra_error, which the next run reruns without charge (docs/ray.md).
"""

from __future__ import annotations

import hashlib
import socket
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mkb.agent.budget import Budget
from mkb.agent.prompts import Gpu
from mkb.environment import Device, device_kind
from mkb.errors import MkbError
from mkb.protocol import RunRequest, drive, judge_grader
from mkb.protocol.attempts import gpu_named, make_attempt, model_config, model_factory
from mkb.protocol.plan import PlanItem
from mkb.protocol.ray_channel import Drainer, Inbox, Outbox
from mkb.protocol.ray_judges import Judges
from mkb.protocol.runner import AttemptContext, AttemptFn, Progress
from mkb.records import JudgeRecord, State, TrialSpec
from mkb.settings import Settings
from mkb.store import Store
from mkb.trial import Outcome, fingerprint_parts, start_run


@dataclass(frozen=True)
class RayOptions:
    """Where and how a run uses Ray."""

    address: str | None = None
    """Cluster to join ('auto', 'ray://head:10001', 'head:6379'); None: RAY_ADDRESS, or the cluster
    'ray start' left on this host, else a new local Ray instance (ray.init's rules)."""
    attempt_cpus: float = 1.0
    """CPUs each attempt task reserves (agents mostly wait on the model API)."""
    n_judges: int | None = None
    """Judge actors; default one per GPU in the cluster (CPU mode: one)."""
    grace_s: float = 30.0
    """After Ctrl-C, how long an attempt may take to reach its next turn before its task is killed."""
    start_timeout_s: float = 300.0
    """How long the judge actors may take to start (e.g. waiting for GPU nodes)."""
    init_kwargs: dict = field(default_factory=dict)
    """Extra ray.init arguments for a local instance (num_cpus, include_dashboard, ...)."""


def import_ray():
    """The ray module, or a one-line error saying how to install it."""
    try:
        import ray
    except ImportError:
        raise MkbError("--executor ray needs Ray, an optional extra. Install it with pip install 'mkb[ray]' "
                       "(or run 'make test-ray' once), or use --executor local.") from None
    return ray


def connect(options: RayOptions):
    """Join (or start) the Ray instance; returns the ray module."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    try:
        _check_reachable(options.address)
        ray.init(address=options.address, **options.init_kwargs)
    except OSError as exc:  # ConnectionError, a timeout, an unknown host
        raise MkbError(f"cannot reach the Ray cluster at {options.address!r} ({exc}). Start it with "
                       f"'ray start --head' (docs/ray.md), or leave --ray-address out for a local one.") from None
    return ray


def _check_reachable(address: str | None, timeout_s: float = 5.0) -> None:
    """Fail fast on a HOST:PORT nobody listens on: ray.init would retry it for minutes."""
    host, _, port = (address or "").removeprefix("ray://").rpartition(":")
    if host and port.isdigit():
        socket.create_connection((host, int(port)), timeout=timeout_s).close()


# -- the attempt task (runs in a Ray worker process) ------------------------------------------------


@dataclass(frozen=True)
class AttemptJob:
    """What every attempt task of a run needs besides its trial."""

    settings: Settings
    model: str
    config: Any
    """The ModelConfig (None for the `reference` oracle)."""
    budget: Budget
    gpu: Gpu


def install_differences(job: AttemptJob, spec: TrialSpec, expected: dict) -> list[str]:
    """Fingerprint parts that differ between this node's install and the driver's (problem, prompts, docs,
    toolchain): a trial run against other files than its fingerprint says would be a wrong result."""
    here = fingerprint_parts(job.settings, spec, job.budget, None).model_dump(mode="json")
    problem = Path(spec.problem.path)
    here["problem"] = hashlib.sha256(problem.read_bytes()).hexdigest() if problem.is_file() else "missing"
    return [k for k in ("problem", "templates", "docs", "toolchain") if here[k] != expected[k]]


def attempt_task(job: AttemptJob, spec: TrialSpec, attempt_id: str, skill_text: str | None, expected: dict,
                 inbox, judges) -> Outcome:
    """One attempt on a Ray worker: the local executor's make_attempt with store calls and grading remote."""
    import ray

    differs = install_differences(job, spec, expected)
    if differs:
        return Outcome(state=State.INFRA_ERROR, message=f"node {socket.gethostname()} differs from the driver in "
                       f"{', '.join(differs)}: run the driver and every Ray node from the same mkb image")
    cancel = threading.Event()
    outbox = Outbox(inbox, cancel)

    def grade_for(spec: TrialSpec):
        return lambda kernel_path: ray.get(judges.grade.remote(
            spec.problem, Path(kernel_path).read_text(encoding="utf-8", errors="replace"), spec.arm.dsl))

    attempt = make_attempt(outbox, job.model, model_factory(job.config, job.settings.solutions_path), job.budget,
                           grade_for, job.settings, job.gpu)
    return attempt(spec, AttemptContext(attempt_id, skill_text, cancel))


# -- the driver side ------------------------------------------------------------------------------


def remote_attempt(ray, job: AttemptJob, inbox, judge_queue, options: RayOptions,
                   env_vars: dict[str, str]) -> AttemptFn:
    """An AttemptFn for ProtocolRun that runs the attempt as a Ray task and waits for its Outcome."""
    task, job_ref = ray.remote(attempt_task), ray.put(job)
    resources = {"num_cpus": options.attempt_cpus, "max_retries": 0,
                 **({"runtime_env": {"env_vars": env_vars}} if env_vars else {})}

    def attempt(spec: TrialSpec, ctx: AttemptContext) -> Outcome:
        expected = fingerprint_parts(job.settings, spec, job.budget, None).model_dump(mode="json")
        ref = task.options(name=f"attempt:{spec.trial_id}", **resources).remote(
            job_ref, spec, ctx.attempt_id, ctx.skill_text, expected, inbox, judge_queue)
        deadline = None
        while not ray.wait([ref], timeout=0.5)[0]:
            if ctx.cancel.is_set():
                deadline = deadline or time.monotonic() + options.grace_s
                if time.monotonic() > deadline:
                    ray.cancel(ref, force=True)
                    return Outcome(state=State.INTERRUPTED, message=f"cancelled; the attempt's Ray task was killed "
                                                                f"after {options.grace_s:.0f} s")
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as exc:  # the attempt code raised: recorded like a local crash
            raise exc.as_instanceof_cause() from None
        except ray.exceptions.TaskCancelledError:
            return Outcome(state=State.INTERRUPTED, message="cancelled; the attempt's Ray task was killed")
        except ray.exceptions.RayError as exc:
            return Outcome(state=State.INFRA_ERROR, message=f"the Ray worker running the attempt was lost "
                                                        f"({type(exc).__name__}); rerun next time, not charged")

    return attempt


def _forwarded_key(config) -> dict[str, str]:
    """The API key to hand to attempt tasks: workers on other nodes lack the driver's environment.
    It travels with the tasks, never stored."""
    if config is None or not config.api_key_env:
        return {}
    key = config.api_key()
    return {config.api_key_env: key} if key else {}


def run_model_ray(settings: Settings, store: Store, request: RunRequest, items: list[PlanItem],
                  options: RayOptions = RayOptions(), grade: Callable[..., JudgeRecord] | None = None,
                  on_event: Callable[[str, TrialSpec, Progress], None] | None = None,
                  on_pool: Callable[[Judges], None] | None = None,
                  given_skills: dict[str, str] | None = None) -> Progress:
    """protocol.execute on a Ray cluster; `grade` defaults to the real judge on the cluster's device.

    settings.device is resolved against the cluster's GPUs (not this host's). Every trial ends recorded,
    however it ends; Ctrl-C/SIGTERM mark running attempts interrupted.
    """
    ray = connect(options)
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    n_gpus = int(ray.cluster_resources().get("GPU", 0))
    kind = device_kind(settings.device, n_gpus, "in the Ray cluster (start GPU workers with "
                                                "'ray start --address HEAD:6379 --num-gpus N')")
    config = model_config(request.model, request.base_url, request.api_key_env, request.sampling,
                          retry_s=settings.model_retry_s)
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    n_judges = options.n_judges or (n_gpus if kind == "cuda" else 1)
    grade = grade or judge_grader(settings, Device(kind=kind, arch=settings.arch))  # the worker pins its GPU
    with Judges(ray, grade, kind, n_judges, settings.judge_timeout_s * 2 + 60, options.start_timeout_s,
                here) as judges:
        if on_pool:
            on_pool(judges)
        gpus = judges.gpus
        device = Device(kind=kind, gpus=gpus, arch=gpus[0]["arch"] if gpus else settings.arch)
        job = AttemptJob(settings, request.model, config, request.budget, gpu_named(device))
        run_id = start_run(store, request.model, config=config, budget=request.budget, settings=settings,
                           device=device, command=request.command)
        inbox = ray.remote(Inbox).options(num_cpus=0, scheduling_strategy=here).remote()
        attempt = remote_attempt(ray, job, inbox, judges.queue, options, _forwarded_key(config))

        @contextmanager
        def draining(runner):
            drainer = Drainer(ray, inbox, store, runner.cancel)
            drainer.start()
            try:
                yield
            finally:
                drainer.stop()

        try:
            return drive(settings, store, request, items, run_id, attempt, on_event, around=draining,
                         given_skills=given_skills)
        finally:
            ray.kill(inbox)
