"""Nothing of a dead judge stays behind: owned working directories, the sweep, and SIGTERM.

A judge's working directories are named after their owner process (`mkb-judge-<pid>.<start>-...`,
the start time telling a reused pid apart), and so are the agent's submission folders
(`mkb-submissions-<pid>-...`). At the start of `mkb verify`, `attempt` and `run-model`,
prepare_host() removes those whose owner is gone (a run killed with kill -9) and makes SIGTERM
end the process through its normal clean-up (atexit: spare processes, working directories).
The judge's processes themselves die with it (PR_SET_PDEATHSIG, processes.py).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import tempfile
import threading
from pathlib import Path

log = logging.getLogger(__name__)

OWNED = re.compile(r"^mkb-(?:judge|submissions)-(\d+)(?:\.(\d+))?-")
"""Names of directories the sweep may remove: an owner pid and, for the judge's, its start time."""


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat), None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def owned_dir(kind: str) -> Path:
    """A new private directory mkb-<kind>-<pid>.<start>-XXXX in the system's temporary directory."""
    pid = os.getpid()
    return Path(tempfile.mkdtemp(prefix=f"mkb-{kind}-{pid}.{start_time(pid)}-"))


def owner_alive(name: str) -> bool:
    """Whether the process that made the directory `name` still runs (True for names the sweep does not own)."""
    match = OWNED.match(name)
    if match is None:
        return True
    pid, started = int(match.group(1)), match.group(2)
    now = start_time(pid)
    return now is not None and (started is None or int(started) == now)


def sweep(places: tuple[Path, ...] | None = None) -> list[Path]:
    """Remove judge working directories and submission folders whose owner process is gone; return them."""
    places = places or (Path(tempfile.gettempdir()), Path("/dev/shm"))
    removed = []
    for place in places:
        try:
            entries = list(place.iterdir())
        except OSError:
            continue
        for entry in entries:
            if OWNED.match(entry.name) and entry.is_dir() and not entry.is_symlink() and not owner_alive(entry.name):
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
    if removed:
        log.info("removed %d leftover judge/submission directories of dead runs", len(removed))
    return removed


def _terminate(signum, frame) -> None:
    raise SystemExit(128 + signum)


def handle_sigterm() -> bool:
    """Let SIGTERM end this process like Ctrl-C ends it, through atexit and finally: (main thread only)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        return False
    signal.signal(signal.SIGTERM, _terminate)
    return True


def prepare_host() -> list[Path]:
    """Before a command grades: remove a dead run's leftovers and let SIGTERM clean up; return what was removed."""
    handle_sigterm()
    return sweep()
