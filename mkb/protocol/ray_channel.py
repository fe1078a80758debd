"""The channel from attempt tasks to the driver, the only writer of the database (DESIGN §8).

An attempt task adds its transcript rows (mkb.trial.Transcript) to an Outbox where it would add them to
the Store. Each row waits in the Inbox actor until the driver's Drainer thread has written it and
acknowledged it. A killed process therefore loses at most the row in flight, and the database contract
is the same as on one host.
"""

from __future__ import annotations

import asyncio
import logging
import threading

from mkb.store import Message, Row, Store, StoredSubmission

log = logging.getLogger(__name__)

TRANSCRIPT_ROWS = (Message, StoredSubmission)
"""The rows an attempt task may add through the inbox (the driver writes every other row itself)."""


class Inbox:
    """Transcript rows from attempt tasks, held until the driver has written them (an async actor)."""

    def __init__(self):
        self._items: list[tuple[int, object]] = []
        self._waiters: dict[int, asyncio.Future] = {}
        self._new = asyncio.Event()
        self._next = 0
        self.cancelled = False

    async def put(self, row) -> bool:
        """Queue a row; returns once written, with whether the run is cancelled."""
        key, self._next = self._next, self._next + 1
        self._waiters[key] = asyncio.get_running_loop().create_future()
        self._items.append((key, row))
        self._new.set()
        error = await self._waiters[key]
        if error:
            raise RuntimeError(f"the driver could not record a {type(row).__name__} row: {error}")
        return self.cancelled

    async def take(self, timeout_s: float) -> list[tuple[int, object]]:
        """The queued rows, waiting up to timeout_s for one."""
        if not self._items:
            self._new.clear()
            try:
                await asyncio.wait_for(self._new.wait(), timeout_s)
            except asyncio.TimeoutError:
                pass
        items, self._items = self._items, []
        return items

    async def ack(self, done: dict[int, str | None]) -> None:
        """Release the callers of written rows (an error text makes their put raise)."""
        for key, error in done.items():
            waiter = self._waiters.pop(key, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(error)

    async def cancel(self) -> None:
        """From now on every put answers 'cancelled': attempts stop at their next turn."""
        self.cancelled = True


class Outbox:
    """The transcript sink of one attempt task: each row is sent to the driver and returns once written there."""

    def __init__(self, inbox, cancel: threading.Event):
        self.inbox, self.cancel = inbox, cancel

    def add(self, row: Row) -> None:
        import ray

        if ray.get(self.inbox.put.remote(row)):
            self.cancel.set()


class Drainer(threading.Thread):
    """Writes the inbox's rows into the store (the single writer) and passes Ctrl-C on."""

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
                self.inbox.ack.remote({key: self._write(row) for key, row in batch})

    def _write(self, row) -> str | None:
        if not isinstance(row, TRANSCRIPT_ROWS):
            return f"{type(row).__name__} is not a row attempts may add"
        try:
            self.store.add(row)
        except Exception as exc:
            log.exception("could not record a %s row", type(row).__name__)
            return f"{type(exc).__name__}: {exc}"
        return None

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=10)
