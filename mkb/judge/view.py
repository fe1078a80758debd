"""What a harness's cell sees: the files, devices and temporary space of a sandboxed judge process.

Read-only: the system's libraries and tools (/usr and its merged top-level links), a few files of
/etc (the loader's cache, users and groups, time zone), the interpreter and every site-packages
directory this Python imports from (torch and the two DSLs), the CUDA toolkit and library
directories named by CUDA_HOME/CUDA_PATH/LD_LIBRARY_PATH, the judge's harness modules and the
kernel's (or problem's) folder. Never: the mkb checkout, the problems and solutions, MKB_HOME,
the home directory; where one of them lies inside a directory shown, an empty tmpfs covers it.
Writable: a private /tmp tmpfs, and the grading's /dev/shm. Devices: bwrap's minimal /dev, plus
the GPU's nodes for GPU gradings (only the visible GPU's when its minor number can be found), and
the device parts of /sys.
"""

from __future__ import annotations

import glob
import os
import site
import sys
from dataclasses import dataclass, field
from pathlib import Path

from mkb.settings import environment

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "passwd", "group", "nsswitch.conf",
             "localtime", "os-release")
"""The files of /etc a harness may read (no secrets: no shadow, no keys, no tokens)."""
SYS_PARTS = ("/sys/block", "/sys/bus", "/sys/class", "/sys/dev", "/sys/devices", "/sys/module")
"""The parts of /sys a cell sees, read-only (the devices CUDA looks up; no firmware, kernel or cgroup trees)."""
GPU_DIR = Path("/proc/driver/nvidia/gpus")
HARNESS_ROOT, KERNEL_ROOT, PROBLEM_ROOT = "/judge", "/kernel", "/problem"
"""Where a cell sees the harness modules, the kernel's folder and the eager harness's problem folder."""


@dataclass(frozen=True)
class View:
    """The mounts of one cell, as bwrap arguments."""

    readonly: tuple[str, ...]
    """Host directories and files shown read-only at their own paths."""
    symlinks: tuple[tuple[str, str], ...]
    """(target, path): top-level links of a merged /usr."""
    hidden: tuple[str, ...]
    """Private paths inside a shown directory, covered with an empty tmpfs."""
    placed: tuple[tuple[str, str], ...]
    """(host path, path in the cell), read-only: the harness modules, the kernel's or problem's folder."""
    devices: tuple[str, ...]
    tmp_bytes: int
    pythonpath: tuple[str, ...] = field(default=())
    """Entries of the judge's PYTHONPATH that the cell shows (the harness imports from them too)."""

    @classmethod
    def for_harness(cls, *, harness_dir: str | None, stage: str | None, stage_root: str, gpu: bool,
                    visible_devices: str | None, tmp_bytes: int, private: tuple[Path, ...],
                    extra: tuple[str, ...] = ()) -> View:
        """extra: directories shown read-only and put first on PYTHONPATH (a trusted anchor's site, mkb.judge.anchor)."""
        private = tuple(Path(p).resolve() for p in private)
        shown, symlinks = [], []
        for top in SYSTEM_DIRS:
            if os.path.islink(top):
                symlinks.append((os.readlink(top), top))
            elif os.path.isdir(top):
                shown.append(top)
        shown += [f"/etc/{name}" for name in ETC_FILES if os.path.exists(f"/etc/{name}")]
        added = [Path(p).resolve() for p in extra]
        for path in [*toolchain_paths(), *added]:  # a venv inside the checkout is shown; the checkout itself never
            covered = any(_within(path, Path(s)) and not any(_within(path, q) and _within(q, Path(s)) and q != Path(s)
                                                             for q in private) for s in shown)
            if path not in private and not covered:
                shown.append(str(path))
        hidden = sorted({str(q) for q in private for s in shown if q != Path(s) and _within(q, Path(s)) and q.exists()})
        placed = [(harness_dir, HARNESS_ROOT)] if harness_dir else []
        placed += [(stage, stage_root)] if stage else []
        pythonpath = tuple(p for p in [*map(str, added), *environment().get("PYTHONPATH", "").split(os.pathsep)]
                           if p and any(_within(Path(p).resolve(), Path(s)) for s in shown)
                           and not any(_within(Path(p).resolve(), q) for q in private))
        return cls(tuple(shown), tuple(symlinks), tuple(hidden), tuple(placed),
                   tuple(gpu_nodes(visible_devices)) if gpu else (), tmp_bytes, pythonpath)

    def bwrap_args(self) -> list[str]:
        # The private /tmp first: a toolchain under /tmp (a checkout's .venv there) is then bound on top of it,
        # not hidden by it.
        args: list[str] = ["--size", str(self.tmp_bytes), "--perms", "1777", "--tmpfs", "/tmp"]
        for target, path in self.symlinks:
            args += ["--symlink", target, path]
        mounts = [(path, "--ro-bind") for path in self.readonly] + [(path, "--tmpfs") for path in self.hidden]
        for path, kind in sorted(mounts, key=lambda m: len(Path(m[0]).parts)):  # parents first, then inside them
            args += [kind, path] if kind == "--tmpfs" else [kind, path, path]
        args += ["--proc", "/proc", "--dev", "/dev"]
        for node in self.devices:
            args += ["--dev-bind", node, node]
        for part in SYS_PARTS:
            args += ["--ro-bind-try", part, part]
        args += ["--bind", "/dev/shm", "/dev/shm"]
        for host, inside in self.placed:
            args += ["--ro-bind", host, inside]
        return args + ["--chdir", "/tmp"]


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def toolchain_paths() -> list[Path]:
    """This interpreter, its prefixes and every directory it imports packages from; CUDA's directories."""
    found: list[Path] = []
    dirs = [sys.prefix, sys.base_prefix, sys.exec_prefix, *site.getsitepackages()]
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    dirs += [p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages"))]
    env = environment()
    dirs += [env[k] for k in ("CUDA_HOME", "CUDA_PATH") if env.get(k)]
    dirs += [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    dirs += [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    for d in dirs:
        path = Path(d).resolve()
        if path.is_dir() and path not in found and path != Path("/"):
            found.append(path)
    return found


def gpu_nodes(visible_devices: str | None, gpus_dir: Path = GPU_DIR) -> list[str]:
    """The NVIDIA device nodes a GPU grading needs: the control nodes and the visible GPUs' (all GPUs'
    when the visible ones cannot be mapped to minor numbers)."""
    nodes = sorted(glob.glob("/dev/nvidia*"))
    minors = visible_minors(visible_devices, gpus_dir)
    if minors is None:
        return nodes
    numbered = [n for n in nodes if n.removeprefix("/dev/nvidia").isdigit()]
    return [n for n in nodes if n not in numbered or int(n.removeprefix("/dev/nvidia")) in minors]


def visible_minors(visible_devices: str | None, gpus_dir: Path = GPU_DIR) -> set[int] | None:
    """Minor numbers of the visible GPUs (CUDA indices in PCI bus order, as the judge's environment sets
    CUDA_DEVICE_ORDER=PCI_BUS_ID), or None when they cannot be told."""
    wanted = [v.strip() for v in (visible_devices or "").split(",") if v.strip()]
    if not wanted or not all(v.isdigit() for v in wanted):
        return None
    gpus = []
    for info in sorted(gpus_dir.glob("*/information")):
        facts = dict(line.split(":", 1) for line in info.read_text().splitlines() if ":" in line)
        minor = facts.get("Device Minor", "").strip()
        if minor.isdigit():
            gpus.append((info.parent.name.lower(), int(minor)))
    gpus.sort()
    try:
        return {gpus[int(v)][1] for v in wanted}
    except IndexError:
        return None
