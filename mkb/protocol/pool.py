"""Judge worker pool: one worker per visible GPU; agents queue evaluations and wait for records."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass
class _Job:
    args: tuple
    kwargs: dict
    future: Future
    queued_at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class Graded:
    """A judge record with how long it waited for a GPU worker (excluded from attempt budgets)."""

    record: Any
    queue_s: float
    worker: str


class JudgePool:
    """Runs `grade(*args, device_slot=slot, **kw)` on one worker thread per slot (GPU index or 'cpu').

    Each worker handles one evaluation at a time, so a GPU never grades two kernels at once
    (timings stay clean); the slot is passed on so the judge can pin its child process to it
    (CUDA_VISIBLE_DEVICES).
    """

    def __init__(self, grade: Callable[..., Any], slots: list[str], now: Callable[[], float] = time.monotonic):
        if not slots:
            raise ValueError("a judge pool needs at least one slot")
        self._grade = grade
        self._now = now
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self.slots = list(slots)
        self.busy: dict[str, str | None] = {s: None for s in slots}
        self.done_count = 0
        self._threads = [threading.Thread(target=self._work, args=(s,), name=f"judge-{s}", daemon=True) for s in slots]
        for t in self._threads:
            t.start()

    @property
    def queued(self) -> int:
        return self._jobs.qsize()

    def submit(self, *args, label: str = "", **kwargs) -> Future:
        """Queue one evaluation; the future resolves to a Graded."""
        job = _Job(args, kwargs | {"_label": label}, Future(), self._now())
        self._jobs.put(job)
        return job.future

    def grade(self, *args, **kwargs) -> Graded:
        """Queue one evaluation and wait for it."""
        return self.submit(*args, **kwargs).result()

    def _work(self, slot: str) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if not job.future.set_running_or_notify_cancel():
                continue
            label = job.kwargs.pop("_label", "")
            waited = self._now() - job.queued_at
            self.busy[slot] = label
            try:
                record = self._grade(*job.args, device_slot=slot, **job.kwargs)
            except BaseException as exc:  # the caller decides; the worker lives on
                log.exception("judge worker %s failed on %s", slot, label)
                job.future.set_exception(exc)
            else:
                job.future.set_result(Graded(record, waited, slot))
            finally:
                self.busy[slot] = None
                self.done_count += 1

    def close(self) -> None:
        """Stop the workers after the queued evaluations."""
        for _ in self._threads:
            self._jobs.put(None)
        for t in self._threads:
            t.join(timeout=5)
