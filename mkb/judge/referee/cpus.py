"""CPU placement while timing: the referee and the timed harness each on a physical core of their own.

A kernel of tens of microseconds is timed with its host launch path inside the window (events around
solve(), the paper's figure), so the figure moves with the speed of the CPU thread that calls solve().
The referee busy-polls its pipe during every timed call; when the scheduler leaves it on the SMT
sibling of the timed thread, or puts other busy work there, that thread runs slower for the whole
run. While timing, the referee claims whole physical cores (every logical CPU of the core), preferring
the GPU's NUMA-local ones, and pins its own thread and the timed harness's thread to one each.

Claims are advisory file locks under the host's temporary directory, so concurrent graders of
this machine (threads, processes, Ray workers) never pin onto the same core; a lock dies with its
process. When too few cores are free, or the machine does not say which CPUs are siblings, nothing is
pinned and the record says so.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from pathlib import Path
from typing import Iterator

_SYS_CPU = Path("/sys/devices/system/cpu")
_SYS_PCI = Path("/sys/bus/pci/devices")


def lock_dir() -> Path:
    """Where claims are kept: the host's temporary directory (a sandboxed grading's /dev/shm is its own)."""
    return Path(tempfile.gettempdir()) / f"mkb-cores-{os.getuid()}"


def parse_cpulist(text: str | None) -> set[int]:
    """'0-3,8,10-11' -> {0, 1, 2, 3, 8, 10, 11}; empty or missing -> empty."""
    cpus: set[int] = set()
    for part in (text or "").strip().split(","):
        if not part.strip():
            continue
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def read_sysfs(path: Path) -> str | None:
    """A sysfs file's text, stripped; None when it cannot be read."""
    try:
        return path.read_text().strip()
    except OSError:
        return None


def physical_cores(allowed: set[int], sys_cpu: Path = _SYS_CPU) -> list[tuple[int, ...]] | None:
    """The physical cores whose logical CPUs are all in `allowed`, each as its sorted CPUs; None when the
    machine does not describe its topology."""
    cores: set[tuple[int, ...]] = set()
    for cpu in allowed:
        siblings = parse_cpulist(read_sysfs(sys_cpu / f"cpu{cpu}" / "topology" / "thread_siblings_list"))
        if not siblings:
            return None
        if siblings <= allowed:
            cores.add(tuple(sorted(siblings)))
    return sorted(cores)


def gpu_local_cpus(pci_bus_id: str | None, sys_pci: Path = _SYS_PCI) -> set[int]:
    """The CPUs of the GPU's NUMA node ('0000:1b:00.0' style bus id); empty when unknown."""
    if not pci_bus_id:
        return set()
    bus = pci_bus_id.lower()
    if bus.count(":") == 2 and len(bus.split(":")[0]) > 4:  # nvidia-smi's 8-digit domain
        bus = bus[-12:]
    return parse_cpulist(read_sysfs(sys_pci / bus / "local_cpulist"))


def preference(cores: list[tuple[int, ...]], local: set[int]) -> list[tuple[int, ...]]:
    """GPU-local cores first; within each group the highest-numbered first (CPU 0 takes the most
    interrupts and housekeeping)."""
    return sorted(cores, key=lambda core: (not set(core) <= local if local else False, -core[0]))


@contextlib.contextmanager
def claimed(count: int, pci_bus_id: str | None = None, directory: Path | None = None,
            allowed: set[int] | None = None, sys_cpu: Path = _SYS_CPU) -> Iterator[list[tuple[int, ...]] | None]:
    """`count` whole physical cores that no other grading on this machine holds, or None (also when no
    further core would stay free, or the lock directory cannot be made)."""
    allowed = set(os.sched_getaffinity(0)) if allowed is None else allowed
    cores = physical_cores(allowed, sys_cpu)
    if not cores or len(cores) < count + 1:  # a free core is always left to everything else
        yield None
        return
    directory = directory or lock_dir()
    try:
        directory.mkdir(mode=0o700, exist_ok=True)
    except OSError:
        yield None
        return
    held: list[tuple[tuple[int, ...], int]] = []
    try:
        for core in preference(cores, gpu_local_cpus(pci_bus_id)):
            if len(held) > count:
                break
            fd = os.open(directory / f"core-{'-'.join(map(str, core))}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            held.append((core, fd))
        if len(held) > count:  # one more core was free: it stays so, for everything unpinned
            os.close(held.pop()[1])
            yield [core for core, _ in held]
        else:
            yield None
    finally:
        for _, fd in held:
            os.close(fd)  # closing the descriptor releases the lock


@contextlib.contextmanager
def pinned(cpu: int | None) -> Iterator[None]:
    """Pin the calling thread to one CPU for the block (no-op for None); the old affinity comes back."""
    if cpu is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
