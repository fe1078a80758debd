"""The channel from attempt tasks to the driver, the only writer of the database (DESIGN §8).

An attempt task calls an Outbox where it would call the Store. Each call waits in the Inbox actor
until the driver's Drainer thread has written it and acknowledged it. A killed process therefore
loses at most the call in flight, and the database contract is the same as on one host.
"""

from __future__ import annotations

import asyncio
import logging
import threading

from mkb.store import Store

log = logging.getLogger(__name__)

STORE_CALLS = ("add_message", "add_submission")
"""The store methods an attempt task may call through the inbox."""


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
