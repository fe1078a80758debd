"""A cgroup per attempt: caps the memory, processes and CPU of everything its commands start, and kills it all.

Used where this process may create cgroups (root on the host): cgroup v2 (a `mkb` group at the root of
the hierarchy), or the v1 memory, pids and cpu hierarchies (hybrid hosts; groups nested under this
process's own, so its limits still apply). Elsewhere (unprivileged, a read-only /sys/fs/cgroup in a
container) open_cgroup says why not and the caller falls back to per-process rlimits.
"""

from __future__ import annotations

import os
import re
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from mkb.agent.limits import MIB, SandboxLimits

ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids", "cpu")
_PERIOD_US = 100_000
_NAME = re.compile(r"mkb-(\d+)-[0-9a-f]{8}$")


@dataclass
class Cgroup:
    """One attempt's cgroup: a directory per controller (the same one for all of them under v2)."""

    dirs: dict[str, Path]
    version: int

    def enter(self) -> None:
        """Move the calling process in (runs in the child between fork and exec: plain system calls only)."""
        for d in set(self.dirs.values()):
            fd = os.open(d / "cgroup.procs", os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)

    def pids(self) -> set[int]:
        found: set[int] = set()
        for d in set(self.dirs.values()):
            try:
                found.update(int(p) for p in (d / "cgroup.procs").read_text().split())
            except (OSError, ValueError):
                pass
        return found

    def kill_all(self, wait_s: float = 5.0) -> bool:
        """SIGKILL every process in the group, also those that left the command's session; True once empty."""
        kill_file = self.dirs.get("pids", next(iter(self.dirs.values()))) / "cgroup.kill"
        if self.version == 2 and kill_file.exists():
            _write(kill_file, "1")
        deadline = time.monotonic() + wait_s
        while pids := self.pids():
            if time.monotonic() > deadline:
                return False
            for pid in pids:  # v1 has no cgroup.kill: kill until nothing is left (a forking process is outrun)
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.005)
        return True

    def oom_kills(self) -> int:
        """Processes the kernel has killed for passing the memory limit, so far."""
        d = self.dirs.get("memory")
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            text = (d / name).read_text() if d else ""
        except OSError:
            return 0
        return next((int(line.split()[1]) for line in text.splitlines() if line.startswith("oom_kill ")), 0)

    def remove(self) -> None:
        self.kill_all()
        for d in set(self.dirs.values()):
            _rmdir(d)


def open_cgroup(limits: SandboxLimits, cpus: float) -> tuple[Cgroup | None, str]:
    """A new cgroup holding the limits (cpus already capped to the host's), or None and why there is none."""
    try:
        if (ROOT / "cgroup.controllers").is_file():
            return _open_v2(limits, cpus)
        return _open_v1(limits, cpus)
    except OSError as exc:
        return None, f"cannot create a cgroup here ({exc.strerror or exc})"


def _open_v2(limits: SandboxLimits, cpus: float) -> tuple[Cgroup | None, str]:
    if not os.access(ROOT, os.W_OK):
        return None, f"{ROOT} is not writable by this user"
    missing = set(CONTROLLERS) - set((ROOT / "cgroup.controllers").read_text().split())
    if missing:
        return None, f"cgroup v2 lacks the {', '.join(sorted(missing))} controller(s)"
    parent = ROOT / "mkb"
    parent.mkdir(exist_ok=True)
    for d in (ROOT, parent):
        if not set(CONTROLLERS) <= set((d / "cgroup.subtree_control").read_text().split()):
            _write(d / "cgroup.subtree_control", " ".join(f"+{c}" for c in CONTROLLERS))
    _sweep([parent])
    group = parent / _new_name()
    group.mkdir()
    _write(group / "memory.max", str(limits.memory_mb * MIB))
    _write(group / "memory.swap.max", "0", optional=True)
    _write(group / "pids.max", str(limits.pids))
    _write(group / "cpu.max", f"{int(cpus * _PERIOD_US)} {_PERIOD_US}")
    return Cgroup({c: group for c in CONTROLLERS}, 2), "cgroup v2"


def _open_v1(limits: SandboxLimits, cpus: float) -> tuple[Cgroup | None, str]:
    own = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        own.update({c: path for c in controllers.split(",") if c})
    parents = {c: ROOT / c / own[c].lstrip("/") for c in CONTROLLERS if c in own and (ROOT / c / "cgroup.procs").exists()}
    if len(parents) < len(CONTROLLERS):
        return None, f"no cgroup v1 {', '.join(c for c in CONTROLLERS if c not in parents)} hierarchy is mounted"
    if not all(os.access(p, os.W_OK) for p in parents.values()):
        return None, f"the cgroup v1 hierarchies under {ROOT} are not writable by this user"
    _sweep(parents.values())
    name = _new_name()
    dirs = {c: p / name for c, p in parents.items()}
    group = Cgroup(dirs, 1)
    try:
        for d in dirs.values():
            d.mkdir()
        _write(dirs["memory"] / "memory.limit_in_bytes", str(limits.memory_mb * MIB))
        _write(dirs["memory"] / "memory.memsw.limit_in_bytes", str(limits.memory_mb * MIB), optional=True)
        _write(dirs["pids"] / "pids.max", str(limits.pids))
        _write(dirs["cpu"] / "cpu.cfs_period_us", str(_PERIOD_US))
        _write(dirs["cpu"] / "cpu.cfs_quota_us", str(int(cpus * _PERIOD_US)))
    except OSError:
        group.remove()
        raise
    return group, "cgroup v1"


def _new_name() -> str:
    return f"mkb-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _sweep(parents) -> None:
    """Remove the groups of mkb processes that died without cleaning up (kill -9), killing what is left in them."""
    for parent in parents:
        for d in parent.iterdir() if parent.is_dir() else ():
            m = _NAME.match(d.name)
            if m and d.is_dir() and not Path(f"/proc/{m.group(1)}").exists():
                Cgroup({"pids": d}, 1).kill_all(wait_s=1.0)
                _rmdir(d)


def _write(path: Path, value: str, optional: bool = False) -> None:
    try:
        path.write_text(value)
    except OSError:
        if not optional:
            raise


def _rmdir(d: Path) -> None:
    for _ in range(100):  # the kernel releases a group a moment after its last process is reaped
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)
