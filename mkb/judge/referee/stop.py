"""The candidate's end, before the eager reference is timed (or the verdict given), confirmed by the judge's parent.

h26 found that the candidate stayed alive while the eager baseline was timed: a thread or GPU stream
it left running could slow the figure it is compared with. The referee cannot see the candidate's
processes (they live in a cell of their own), so it asks the judge's parent, which can: it writes
"S" on its readiness pipe; the parent lets the candidate exit (it was told to finish), kills its
process group, waits until none of the processes it had is left, and answers with one JSON line on
the referee's control pipe (evaluation.Evaluation._stop_candidate).
"""

from __future__ import annotations

import json
import os
import select
import time

from mkb.judge.candidate import wire
from mkb.judge.referee.verdict import Failure
from mkb.records import Status

WAIT_S = 60.0
"""How long the referee waits for the parent to confirm that the candidate's processes have ended."""


def end_candidate(channel: wire.Channel, ready_fd: int, control_fd: int, wait_s: float = WAIT_S) -> dict:
    """Tell the candidate to finish, ask the parent to end it, and wait for its account (exited by itself or
    killed, how many processes it had, how many were left, how long it took).

    Raises:
        Failure: the parent is gone or did not confirm in time (charged as a crash once kernel.py loaded).
    """
    try:
        channel.send({"cmd": "finish"})
    except wire.WireError:  # already gone
        pass
    return _ask_parent(b"S", ready_fd, control_fd, wait_s, "it cannot end the candidate's processes",
                       f"did not confirm within {wait_s:g} s that the candidate's processes ended")


def relieve(ready_fd: int, control_fd: int, wait_s: float = WAIT_S) -> dict:
    """Ask the judge's parent for a fresh candidate process after the last one died inside a knocked-out draw ("R"
    on the readiness pipe; evaluation.Evaluation._relieve) and wait for its account: relieved (true, or false with
    why), how the dead one ended (exit), how many processes it had and how many were left.

    Raises:
        Failure: the parent is gone or did not answer in time.
    """
    return _ask_parent(b"R", ready_fd, control_fd, wait_s, "it cannot start a fresh candidate process",
                       f"did not start a fresh candidate process within {wait_s:g} s")


def _ask_parent(signal: bytes, ready_fd: int, control_fd: int, wait_s: float, gone: str, late: str) -> dict:
    """Write signal on the readiness pipe and wait for the parent's one-line answer on the control pipe.

    Raises:
        Failure: infra_error, "the judge is gone: {gone}" or "the judge {late}".
    """
    try:
        os.write(ready_fd, signal)
    except OSError:
        raise Failure(Status.INFRA_ERROR, f"the judge is gone: {gone}") from None
    reply = read_line(control_fd, wait_s)
    if reply is None:
        raise Failure(Status.INFRA_ERROR, f"the judge {late}")
    return reply


def read_line(fd: int, wait_s: float) -> dict | None:
    """One JSON object on one line from fd, or None on timeout, end of file or anything else."""
    data, deadline = b"", time.monotonic() + wait_s
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 4096)
        if not chunk:
            return None
        data += chunk
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
