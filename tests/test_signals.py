"""The referee's bounded host wait for a harness's signal (timing.settle): the CPU part of wire.Signal's contract.

The signals themselves (cuStreamWriteValue32 / cuStreamWaitValue32 across the sandbox's cells) need a GPU:
scripts/gpu_sandbox_check.py measures them there (`gpu_session.sh sandbox`).
"""

from __future__ import annotations

import time

import pytest

from mkb.judge.referee import timing


class _Event:
    """Stands in for a CUDA event on the referee's stream: ready after `after` queries (never when None)."""

    def __init__(self, after: int | None):
        self.after, self.queries = after, 0

    def query(self) -> bool:
        self.queries += 1
        return self.after is not None and self.queries > self.after


def test_a_signal_that_comes_ends_the_wait():
    event = _Event(after=3)
    timing.settle(event, 5.0, "never")
    assert event.queries == 4


def test_a_signal_that_never_comes_is_a_timeout_within_the_limit():
    started = time.monotonic()
    with pytest.raises(timing.TimingError) as caught:
        timing.settle(_Event(after=None), 0.2, "the harness said its call was launched but never signalled it")
    assert caught.value.kind == "timeout" and "never signalled it within 0.2 s" in str(caught.value)
    assert 0.2 <= time.monotonic() - started < 5.0
