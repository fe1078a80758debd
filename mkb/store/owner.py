"""The process that owns a run (host, pid, process start), whether it still lives, and the rows it left behind.

A run row records its owner when it starts. A process killed with SIGKILL (or a machine that stopped)
cannot record how its run ended, so its run, attempts and trials stay `running`. The next mkb that opens
the database for writing marks them `interrupted` when their owner is gone:

- same host: no live process has the recorded pid *and* start time (a reused pid is another process;
  a start time from an earlier boot is gone);
- another host (e.g. an earlier container, which has its own host name), or no owner recorded (rows of
  an older mkb): the owner cannot be looked up from here. DuckDB lets one process hold a database open
  for writing and every run holds it from start to end, so our own write lock shows the owner is done.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path

import duckdb

from mkb.records import State

log = logging.getLogger(__name__)

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@dataclass(frozen=True)
class Owner:
    """A process, named so that a later process can tell whether it is still alive."""

    host: str
    """socket.gethostname() of the process."""
    pid: int
    """Its process id."""
    start: str | None
    """'<boot id>/<start time in clock ticks since boot>' (Linux); None where /proc cannot say."""


def process_start(pid: int) -> str | None:
    """The start identity of a live process ('<boot id>/<ticks>'); None when there is no such (live) process
    or /proc cannot say (not Linux)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = _BOOT_ID.read_text().strip()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
    if fields[0] in ("Z", "X"):  # a zombie has exited; only its exit status is left
        return None
    return f"{boot}/{fields[19]}"


def current_owner() -> Owner:
    """This process."""
    return Owner(host=socket.gethostname(), pid=os.getpid(), start=process_start(os.getpid()))


def is_alive(owner: Owner) -> bool:
    """Whether the owner may still be running (see the module docstring for the rule)."""
    if owner.host != socket.gethostname():
        return False
    if owner.start is None or not _BOOT_ID.exists():  # no start time recorded, or no /proc: the pid alone
        try:
            os.kill(owner.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return process_start(owner.pid) == owner.start


def reap(db: duckdb.DuckDBPyConnection) -> int:
    """Mark `interrupted` the running runs whose owner is gone, and the running attempts and trials of runs
    that are no longer running; their messages say why. Call inside a transaction. Returns the rows marked."""
    running, interrupted = str(State.RUNNING), str(State.INTERRUPTED)
    runs = db.execute("SELECT run_id, host, owner_pid, owner_start FROM runs WHERE state = ?", [running]).fetchall()
    gone = [(run_id, host, pid) for run_id, host, pid, start in runs
            if pid is None or not is_alive(Owner(host or "", pid, start))]
    for run_id, host, pid in gone:
        db.execute("UPDATE runs SET state = ? WHERE run_id = ?", [interrupted, run_id])
    why = "interrupted: its run's process ended without recording how it ended (killed, or the machine stopped)"
    marked = len(gone)
    for table in ("attempts", "trials"):
        found = db.execute(
            f"UPDATE {table} SET state = ?, message = concat_ws('; ', message, ?) "
            f"WHERE state = ? AND run_id IN (SELECT run_id FROM runs WHERE state <> ?)",
            [interrupted, why, running, running]).fetchone()
        marked += found[0] if found else 0
    if gone:
        owners = ", ".join(f"pid {pid} on {host}" if pid is not None else "owner not recorded"
                           for _, host, pid in gone[:3])
        log.warning("%d runs left running by processes that are gone (%s%s): marked interrupted, with their running "
                    "attempts and trials (rerun by the next run-model)", len(gone), owners,
                    ", ..." if len(gone) > 3 else "")
    return marked
