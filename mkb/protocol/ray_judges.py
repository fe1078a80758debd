"""Judge evaluations on Ray: one JudgeWorker actor per GPU, a JudgeQueue actor handing them out.

A worker grades one kernel at a time, so a GPU never times two kernels at once. The time an
evaluation waits for a free worker is queue time and is never charged to the attempt. A worker
lost mid-evaluation is restarted by Ray and the evaluation retried; after that it is an infra_error.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from mkb.environment import toolchain_versions
from mkb.errors import MkbError
from mkb.protocol.pool import Graded
from mkb.records import Dsl, JudgeRecord, ProblemInfo, Status

log = logging.getLogger(__name__)


class JudgeWorker:
    """Grades one kernel at a time on its own GPU (or CPU): grade(problem, path, dsl, device_slot=...)."""

    def __init__(self, grade: Callable[..., JudgeRecord], device: str):
        self._grade, self.device = grade, device

    def _slot(self) -> str:
        import ray

        return ",".join(str(g) for g in ray.get_gpu_ids()) if self.device == "cuda" else "cpu"

    def facts(self) -> dict:
        """Where this worker runs: host, GPU slot, GPUs, toolchain."""
        return {"host": socket.gethostname(), "slot": self._slot(), "gpus": self._gpus(),
                "toolchain": toolchain_versions()}

    def _gpus(self) -> list[dict]:
        # Asked in a child process: CUDA initialised in this long-lived actor would hold memory on
        # the GPU that every timed kernel then shares.
        if self.device != "cuda":
            return []
        script = "import json; from mkb import environment; print(json.dumps(environment.gpus()))"
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
        return json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 and out.stdout.strip() else []

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
            self.close()
            raise MkbError(f"{n} judge actors ({resources}) did not start within {start_timeout_s:.0f} s. "
                           f"Add nodes with free GPUs, or check 'ray status'.") from None
        drift = sorted({f["host"] for f in self.facts if f["toolchain"] != toolchain_versions()})
        if drift:
            self.close()
            raise MkbError(f"judge nodes {drift} run another toolchain than the driver. Run the driver and "
                           f"every Ray node from the same mkb image.")
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
        for actor in [getattr(self, "queue", None), *self.workers]:
            if actor is not None:
                self.ray.kill(actor)

    def __enter__(self) -> "Judges":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
