"""Scale-out on Ray: attempts as Ray tasks, judge evaluations on one-GPU actors, the driver the only writer.

The driver plans from the store and runs the same ProtocolRun as the local executor. Each attempt is a
Ray task (CPU) running make_attempt on whichever node Ray picks. What an attempt writes (transcript
messages, submissions) travels to the driver as a store call through an Inbox actor, and the task goes
on only once the driver has written it: the database contract is unchanged and a killed process loses
at most the message in flight. Judge evaluations wait in a JudgeQueue actor for a JudgeWorker actor
holding one GPU (in CPU mode, one CPU); that wait is reported as queue time, never charged to a budget.
A lost worker or node ends its attempt as an infra_error, which the next run reruns without charge.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mkb import environment
from mkb.agent.budget import Budget
from mkb.agent.prompts import Gpu, toolchain_versions
from mkb.errors import MkbError
from mkb.protocol import RunRequest, _stop_on_signals, current_parts, executor_factory, judge_grader
from mkb.protocol.attempts import ORACLE, make_attempt, oracle_model
from mkb.protocol.plan import PlanItem, TrialSpec
from mkb.protocol.pool import Graded
from mkb.protocol.runner import AttemptContext, AttemptFn, Outcome, Progress, ProtocolRun
from mkb.records import Dsl, JudgeRecord, ProblemInfo, Status
from mkb.settings import Settings
from mkb.store import Store

log = logging.getLogger(__name__)

STORE_CALLS = ("add_message", "add_submission")
"""The store methods an attempt task may call through the inbox."""


@dataclass(frozen=True)
class RayOptions:
    """Where and how a run uses Ray."""

    address: str | None = None
    """Cluster to join ('auto', 'ray://head:10001', 'head:6379'); None starts a local Ray instance."""
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
    if not ray.is_initialized():
        try:
            ray.init(address=options.address, **options.init_kwargs)
        except ConnectionError as exc:
            raise MkbError(f"cannot reach the Ray cluster at {options.address!r} ({exc}). Start it with "
                           f"'ray start --head' (docs/ray.md), or leave --ray-address out for a local one.") from None
    return ray


# -- actors and tasks (these run in Ray worker processes) ----------------------------------------


class Inbox:
    """Store calls from attempt tasks, held until the driver has written them (an async actor)."""

    def __init__(self):
        self._items: list[tuple[int, tuple]] = []
        self._waiters: dict[int, asyncio.Future] = {}
        self._new = asyncio.Event()
        self._next = 0
        self.cancelled = False

    async def put(self, call: tuple) -> bool:
        """Queue (method, args, kwargs); returns once written, with whether the run is cancelled."""
        key, self._next = self._next, self._next + 1
        self._waiters[key] = asyncio.get_running_loop().create_future()
        self._items.append((key, call))
        self._new.set()
        error = await self._waiters[key]
        if error:
            raise RuntimeError(f"the driver could not record {call[0]}: {error}")
        return self.cancelled

    async def take(self, timeout_s: float) -> list[tuple[int, tuple]]:
        """The queued calls, waiting up to timeout_s for one."""
        if not self._items:
            self._new.clear()
            try:
                await asyncio.wait_for(self._new.wait(), timeout_s)
            except asyncio.TimeoutError:
                pass
        items, self._items = self._items, []
        return items

    async def ack(self, done: dict[int, str | None]) -> None:
        """Release the callers of written calls (an error text makes their put raise)."""
        for key, error in done.items():
            waiter = self._waiters.pop(key, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(error)

    async def cancel(self) -> None:
        """From now on every put answers 'cancelled': attempts stop at their next turn."""
        self.cancelled = True


class JudgeWorker:
    """Grades one kernel at a time on its own GPU (or CPU): grade(problem, path, dsl, device_slot=...)."""

    def __init__(self, grade: Callable[..., JudgeRecord], device: str):
        self._grade, self.device = grade, device

    def _slot(self) -> str:
        import ray

        return ",".join(str(g) for g in ray.get_gpu_ids()) if self.device == "cuda" else "cpu"

    def facts(self) -> dict:
        """Where this worker runs: host, GPU slot, GPUs, toolchain."""
        gpus = environment.gpus() if self.device == "cuda" else []
        return {"host": socket.gethostname(), "slot": self._slot(), "gpus": gpus, "toolchain": toolchain_versions()}

    def grade(self, problem: ProblemInfo, kernel_source: str, dsl: Dsl) -> JudgeRecord:
        """Grade a kernel given as source text (the attempt's workspace may be on another node)."""
        with tempfile.TemporaryDirectory(prefix="mkb-ray-kernel-") as tmp:
            path = Path(tmp) / "kernel.py"
            path.write_text(kernel_source, encoding="utf-8")
            return self._grade(problem, str(path), dsl, device_slot=self._slot())


class JudgeQueue:
    """Hands evaluations to free judge workers, one each; the wait is queue time (an async actor).

    A worker lost mid-evaluation (its process or node died) is restarted by Ray; the evaluation is retried
    after each of backoff_s, the waits counted as queue time, and after that recorded as an infra_error.
    """

    def __init__(self, workers: list, names: list[str], device: str, timeout_s: float,
                 backoff_s: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 16.0), now: Callable[[], float] = time.monotonic):
        self._free: asyncio.Queue = asyncio.Queue()
        for worker, name in zip(workers, names):
            self._free.put_nowait((worker, name))
        self.device, self.timeout_s, self.backoff_s, self._now = device, timeout_s, backoff_s, now
        self.waiting = 0

    async def grade(self, problem: ProblemInfo, kernel_source: str, dsl: Dsl) -> Graded:
        queued_at = self._now()
        self.waiting += 1
        try:
            worker, name = await self._free.get()
        finally:
            self.waiting -= 1
        queue_s = self._now() - queued_at
        try:
            record, waited_s = await self._grade_on(worker, name, problem, kernel_source, dsl)
        finally:
            self._free.put_nowait((worker, name))
        return Graded(record, queue_s + waited_s, name)

    async def _grade_on(self, worker, name: str, problem: ProblemInfo, kernel_source: str,
                        dsl: Dsl) -> tuple[JudgeRecord, float]:
        from ray.exceptions import RayActorError

        waited_s = 0.0
        for wait_s in (*self.backoff_s, None):
            try:
                record = await asyncio.wait_for(worker.grade.remote(problem, kernel_source, dsl), self.timeout_s)
                return record, waited_s
            except RayActorError as exc:  # a lost GPU is infrastructure, never the kernel's fault
                why = f"was lost during the evaluation ({type(exc).__name__}, {len(self.backoff_s) + 1} tries)"
            except asyncio.TimeoutError:
                wait_s, why = None, f"did not answer within {self.timeout_s:.0f} s"
            if wait_s is None:
                break
            log.warning("judge worker %s %s; retrying in %.0f s", name, why, wait_s)
            await asyncio.sleep(wait_s)
            waited_s += wait_s
        return JudgeRecord(status=Status.INFRA_ERROR, problem=problem.id, dsl=dsl, device=self.device,
                           message=f"judge worker {name} {why}; not charged"), waited_s

    async def queued(self) -> int:
        return self.waiting


@dataclass(frozen=True)
class AttemptJob:
    """What every attempt task of a run needs besides its trial."""

    settings: Settings
    model: str
    config: Any
    """The ModelConfig (None for the `reference` oracle)."""
    budget: Budget
    sandbox: str
    image: str
    gpu: Gpu

    def model_for(self, spec: TrialSpec):
        if self.config is None:
            return oracle_model(spec.problem, spec.arm.dsl, self.settings.solutions_path)
        from mkb.agent.model import ChatModel

        return ChatModel(self.config)


class Outbox:
    """The store calls of one attempt task, sent to the driver; each returns once written there."""

    def __init__(self, inbox, cancel: threading.Event):
        self.inbox, self.cancel = inbox, cancel

    def _send(self, name: str, *args, **kwargs) -> None:
        import ray

        if ray.get(self.inbox.put.remote((name, args, kwargs))):
            self.cancel.set()

    def add_message(self, attempt_id: str, seq: int, message: dict) -> None:
        self._send("add_message", attempt_id, seq, message)

    def add_submission(self, attempt_id: str, n: int, kind: str, record, **fields) -> None:
        self._send("add_submission", attempt_id, n, kind, record, **fields)


def install_differences(job: AttemptJob, spec: TrialSpec, expected: dict) -> list[str]:
    """Fingerprint parts that differ between this node's install and the driver's (problem, prompts, docs,
    toolchain): a trial run against other files than its fingerprint says would be a wrong result."""
    here = current_parts(job.settings, spec, None, job.budget).model_dump(mode="json")
    problem = Path(spec.problem.path)
    here["problem"] = hashlib.sha256(problem.read_bytes()).hexdigest() if problem.is_file() else "missing"
    return [k for k in ("problem", "templates", "docs", "toolchain") if here[k] != expected[k]]


def attempt_task(job: AttemptJob, spec: TrialSpec, attempt_id: str, skill_text: str | None, expected: dict,
                 inbox, judges) -> Outcome:
    """One attempt on a Ray worker: the local executor's make_attempt with store calls and grading remote."""
    import ray

    differs = install_differences(job, spec, expected)
    if differs:
        return Outcome(state="infra_error", message=f"node {socket.gethostname()} differs from the driver in "
                       f"{', '.join(differs)}: run the driver and every Ray node from the same mkb image")
    cancel = threading.Event()
    outbox = Outbox(inbox, cancel)

    def grade_for(spec: TrialSpec):
        return lambda kernel_path: ray.get(judges.grade.remote(
            spec.problem, Path(kernel_path).read_text(encoding="utf-8", errors="replace"), spec.arm.dsl))

    attempt = make_attempt(outbox, job.model, job.model_for, job.budget, grade_for,
                           executor_factory(job.sandbox, job.image), job.settings.home / "workspaces",
                           job.settings.problems_dir, job.gpu)
    ctx = AttemptContext(attempt_id, skill_text, lambda seq, m: outbox.add_message(attempt_id, seq, m), cancel)
    return attempt(spec, ctx)


# -- the driver side ------------------------------------------------------------------------------


class Judges:
    """The judge actors of a run and their queue, as the progress view sees a JudgePool."""

    def __init__(self, ray, grade: Callable[..., JudgeRecord], device: str, n: int, timeout_s: float,
                 start_timeout_s: float, pin):
        resources = {"num_cpus": 1, "num_gpus": 1 if device == "cuda" else 0}
        worker = ray.remote(JudgeWorker).options(max_restarts=-1, max_task_retries=0, **resources)
        self.ray, self.workers = ray, [worker.remote(grade, device) for _ in range(n)]
        try:
            self.facts = ray.get([w.facts.remote() for w in self.workers], timeout=start_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise MkbError(f"{n} judge actors ({resources}) did not start within {start_timeout_s:.0f} s. "
                           f"Add nodes with free GPUs, or check 'ray status'.") from None
        self.slots = [f"{f['host']}:{f['slot']}" for f in self.facts]
        self.queue = ray.remote(JudgeQueue).options(num_cpus=0, scheduling_strategy=pin).remote(
            self.workers, self.slots, device, timeout_s)

    @property
    def queued(self) -> int:
        """Evaluations waiting for a judge worker."""
        try:
            return self.ray.get(self.queue.queued.remote(), timeout=2)
        except Exception:  # the progress view must never stop a run
            return 0

    @property
    def gpus(self) -> list[dict]:
        return [{"host": f["host"], **g} for f in self.facts for g in f["gpus"]]

    def close(self) -> None:
        for actor in [self.queue, *self.workers]:
            self.ray.kill(actor)


class Drainer(threading.Thread):
    """Writes the inbox's store calls into the store (the single writer) and passes Ctrl-C on."""

    def __init__(self, ray, inbox, store: Store, cancel: threading.Event):
        super().__init__(name="ray-inbox", daemon=True)
        self.ray, self.inbox, self.store, self.cancel = ray, inbox, store, cancel
        self.halt = threading.Event()

    def run(self) -> None:
        told = False
        while not self.halt.is_set():
            if self.cancel.is_set() and not told:
                self.inbox.cancel.remote()
                told = True
            try:
                batch = self.ray.get(self.inbox.take.remote(0.2))
            except self.ray.exceptions.RayError:
                log.exception("the Ray inbox was lost; running attempts end as infra errors")
                return
            if batch:
                self.inbox.ack.remote({key: self._write(call) for key, call in batch})

    def _write(self, call: tuple) -> str | None:
        name, args, kwargs = call
        if name not in STORE_CALLS:
            return f"{name} is not a store call attempts may make"
        try:
            getattr(self.store, name)(*args, **kwargs)
        except Exception as exc:
            log.exception("could not record %s", name)
            return f"{type(exc).__name__}: {exc}"
        return None

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=10)


def remote_attempt(ray, settings: Settings, job_ref, budget: Budget, inbox, judges: Judges,
                   options: RayOptions, env_vars: dict[str, str]) -> AttemptFn:
    """An AttemptFn for ProtocolRun that runs the attempt as a Ray task and waits for its Outcome."""
    task = ray.remote(attempt_task)
    resources = {"num_cpus": options.attempt_cpus, "max_retries": 0,
                 **({"runtime_env": {"env_vars": env_vars}} if env_vars else {})}

    def attempt(spec: TrialSpec, ctx: AttemptContext) -> Outcome:
        expected = current_parts(settings, spec, None, budget).model_dump(mode="json")
        ref = task.options(name=f"attempt:{spec.trial_id}", **resources).remote(
            job_ref, spec, ctx.attempt_id, ctx.skill_text, expected, inbox, judges.queue)
        deadline = None
        while not ray.wait([ref], timeout=0.5)[0]:
            if ctx.cancel.is_set():
                deadline = deadline or time.monotonic() + options.grace_s
                if time.monotonic() > deadline:
                    ray.cancel(ref, force=True)
                    return Outcome(state="interrupted", message=f"cancelled; the attempt's Ray task was killed "
                                                                f"after {options.grace_s:.0f} s")
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as exc:  # the attempt code raised: recorded like a local crash
            raise exc.as_instanceof_cause() from None
        except ray.exceptions.TaskCancelledError:
            return Outcome(state="interrupted", message="cancelled; the attempt's Ray task was killed")
        except ray.exceptions.RayError as exc:
            return Outcome(state="infra_error", message=f"the Ray worker running the attempt was lost "
                                                        f"({type(exc).__name__}); rerun next time, not charged")

    return attempt


def _model_access(request: RunRequest) -> tuple[Any, dict, dict[str, str]]:
    """ModelConfig (None for the oracle), the run's provider columns, and the key to forward to workers."""
    if request.model == ORACLE:
        return None, {"provider": "oracle", "is_oracle": True}, {}
    from mkb.agent.model import parse_model_spec

    config = parse_model_spec(request.model, request.base_url, request.api_key_env, **(request.sampling or {}))
    key = config.api_key()  # a missing key fails here, in one line, before anything runs
    provider = {"provider": config.provider, "base_url": config.base_url, "api_key_env": config.api_key_env,
                "params": config.model_dump(mode="json", exclude={"api_key_env"})}
    # Workers on other nodes lack the driver's environment: the key travels with the tasks, never stored.
    return config, provider, {config.api_key_env: key} if config.api_key_env and key else {}


def judge_device(ray, device: str) -> str:
    """auto/cuda/cpu resolved against the cluster's GPUs (not this host's)."""
    n_gpus = int(ray.cluster_resources().get("GPU", 0))
    if device == "cuda" and not n_gpus:
        raise MkbError("--device cuda but the Ray cluster has no GPU. Start GPU workers "
                       "('ray start --address HEAD:6379 --num-gpus N'), or use --device cpu.")
    return device if device != "auto" else "cuda" if n_gpus else "cpu"


def run_model_ray(settings: Settings, store: Store, request: RunRequest, items: list[PlanItem],
                  options: RayOptions = RayOptions(), device: str = "auto",
                  grade: Callable[..., JudgeRecord] | None = None,
                  on_event: Callable[[str, TrialSpec, Progress], None] | None = None,
                  on_pool: Callable[[Judges], None] | None = None) -> Progress:
    """protocol.run_model on a Ray cluster; `grade` defaults to the real judge on the resolved device.

    Every trial ends recorded, however it ends; Ctrl-C/SIGTERM mark running attempts interrupted.
    """
    ray = connect(options)
    device = judge_device(ray, device)
    config, provider, env_vars = _model_access(request)
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    n_judges = options.n_judges or (int(ray.cluster_resources().get("GPU", 0)) if device == "cuda" else 1)
    judges = Judges(ray, grade or judge_grader(settings, device), device, n_judges, settings.judge_timeout_s * 2 + 60,
                    options.start_timeout_s, here)
    try:
        drift = [f["host"] for f in judges.facts if f["toolchain"] != toolchain_versions()]
        if drift:
            raise MkbError(f"judge nodes {sorted(set(drift))} run another toolchain than the driver. Run the "
                           f"driver and every Ray node from the same mkb image.")
        if on_pool:
            on_pool(judges)
        return _run(ray, settings, store, request, items, judges, config, provider, env_vars, options, here,
                    on_event)
    finally:
        judges.close()


def _run(ray, settings, store, request, items, judges, config, provider, env_vars, options, here, on_event):
    run_id = uuid.uuid4().hex
    facts = environment.describe(with_gpu=False)
    store.start_run(run_id, request.model, versions=facts["versions"], git_commit=facts["git_commit"],
                    host=facts["host"], gpus=judges.gpus, command="run-model", **provider)
    gpus = judges.gpus
    gpu = Gpu(name=gpus[0]["name"], arch=gpus[0]["arch"]) if gpus else Gpu()
    job = AttemptJob(settings, request.model, config, request.budget, request.sandbox, request.image, gpu)
    inbox = ray.remote(Inbox).options(num_cpus=0, scheduling_strategy=here).remote()
    attempt = remote_attempt(ray, settings, ray.put(job), request.budget, inbox, judges, options, env_vars)
    skills_sha = lambda spec, sha: current_parts(settings, spec, sha, request.budget)  # noqa: E731
    runner = ProtocolRun(store, request.model, run_id, attempt, skills_sha, request.concurrency, on_event)
    drainer = Drainer(ray, inbox, store, runner.cancel)
    drainer.start()
    state = "interrupted"
    try:
        with _stop_on_signals(runner.cancel):
            progress = runner.run(items)
        state = "finished"
        return progress
    except KeyboardInterrupt:
        runner.cancel.set()
        raise
    finally:
        drainer.stop()
        ray.kill(inbox)
        store.finish_run(run_id, state)
