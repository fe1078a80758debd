"""Resource limits of an attempt's sandbox, the same for every backend, and the disk watchdog of the local one."""

from __future__ import annotations

import logging
import os
import resource
import threading
import time
from collections.abc import Callable
from pathlib import Path

from mkb.records import Record

log = logging.getLogger(__name__)

MIB = 1 << 20


class SandboxLimits(Record):
    """What one attempt's commands may use at once (bubblewrap and Docker alike)."""

    memory_mb: int = 16384
    """Memory of all the attempt's processes together, in MiB (swap not allowed)."""
    pids: int = 1024
    """Processes and threads at once."""
    cpus: float = 4.0
    """CPU time per second of wall clock (a quota, not pinning); capped to the CPUs the host has."""
    disk_mb: int = 4096
    """What the workspace and the private /tmp may each hold, in MiB; also the largest single file."""
    files: int = 100_000
    """Files and directories the workspace and the private /tmp may each hold (inodes)."""
    shm_mb: int = 512
    """Size of /dev/shm, in MiB."""


def host_cpus() -> int:
    """CPUs this process may run on."""
    return len(os.sched_getaffinity(0))


def capped_cpus(limits: SandboxLimits, available: int) -> tuple[float, str]:
    """(CPU quota to ask for, how it is described): at most the CPUs there are, which the engines insist on."""
    if limits.cpus <= available:
        return limits.cpus, f"{limits.cpus:g} CPUs"
    log.info("the sandbox's CPU limit is capped to %d, the CPUs this host has (asked for %g)", available, limits.cpus)
    return float(available), f"{available} CPUs (capped from {limits.cpus:g}: the host has {available})"


def rlimits(limits: SandboxLimits, *, memory: bool) -> list[tuple[int, int]]:
    """Per-process limits for a command: no core files, no file above the disk limit, and (where no cgroup
    caps the attempt's memory) no process with more address space than the memory limit."""
    pairs = [(resource.RLIMIT_CORE, 0), (resource.RLIMIT_FSIZE, limits.disk_mb * MIB)]
    if memory:
        pairs.append((resource.RLIMIT_AS, limits.memory_mb * MIB))
    return pairs


def apply_rlimits(pairs: list[tuple[int, int]]) -> None:
    """Runs in the child between fork and exec; a limit above the inherited hard limit keeps that one."""
    for which, value in pairs:
        _, hard = resource.getrlimit(which)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (value, value))


def usage(root: Path) -> tuple[int, int]:
    """(bytes allocated, entries) under root: sparse files count what they use; links are not followed."""
    total, entries, stack = 0, 0, [str(root)]
    while stack:
        try:
            with os.scandir(stack.pop()) as found:
                for entry in found:
                    entries += 1
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                        else:
                            total += entry.stat(follow_symlinks=False).st_blocks * 512
                    except OSError:
                        continue
        except OSError:
            continue
    return total, entries


class DiskWatch:
    """Polls some directories while a command runs and calls on_over once when one of them has grown past
    max(its limit, what it held when the command started), in bytes or in entries: a command can always
    delete, never grow a directory that is over a limit. The overshoot is bounded by the poll interval (and,
    for bytes, RLIMIT_FSIZE)."""

    def __init__(self, dirs: dict[str, Path], limits: SandboxLimits, on_over: Callable[[], None],
                 interval_s: float = 0.2):
        """Args:
            dirs: what each directory is called in the notice (e.g. "the workspace", "/tmp") -> its host path.
        """
        self.dirs = {label: Path(d) for label, d in dirs.items()}
        self.limits, self.on_over, self.interval_s = limits, on_over, interval_s
        self.allowed = {}
        for label, d in self.dirs.items():
            used, entries = usage(d)
            self.allowed[label] = (max(limits.disk_mb * MIB, used), max(limits.files, entries))
        self.over: str | None = None
        """Which directory went over which limit, for the command's output; None while none has."""
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="disk-watch", daemon=True)

    def __enter__(self) -> DiskWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()

    def _poll(self) -> None:
        wait = self.interval_s
        while not self._done.wait(wait):
            started = time.monotonic()
            for label, d in self.dirs.items():
                (used, entries), (max_bytes, max_entries) = usage(d), self.allowed[label]
                if used > max_bytes or entries > max_entries:
                    self.over = (f"{label} held {used // MIB} MiB, over the sandbox's {self.limits.disk_mb} MiB limit"
                                 if used > max_bytes else
                                 f"{label} held {entries} files, over the sandbox's {self.limits.files} limit")
                    self.on_over()
                    return
            wait = max(self.interval_s, 5 * (time.monotonic() - started))  # a huge tree is polled less often
