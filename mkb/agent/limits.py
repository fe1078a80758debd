"""Resource limits of an attempt's sandbox, the same for every backend, and the per-process ones of the local one."""

from __future__ import annotations

import logging
import os
import resource

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
