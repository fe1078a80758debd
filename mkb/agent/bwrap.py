"""The local sandbox's bubblewrap command line: what an agent's command sees, and whether bubblewrap runs here."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

from mkb.agent.limits import MIB

WORKDIR = "/workspace"
"""Where the workspace appears inside an isolated sandbox (bubblewrap, Docker)."""
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")
"""Host directories a bubblewrap sandbox sees, read-only, besides the toolchain and the workspace."""


@lru_cache(maxsize=1)
def bwrap_problem() -> str | None:
    """Why bubblewrap cannot isolate commands here, or None when it can."""
    exe = shutil.which("bwrap")
    if exe is None:
        return "bwrap is not installed"
    try:
        probe = subprocess.run([exe, "--unshare-net", "--unshare-pid", "--ro-bind", "/", "/", "--proc", "/proc",
                                "--dev", "/dev", "true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap failed to start: {exc}"
    return None if probe.returncode == 0 else f"bwrap cannot create namespaces: {probe.stderr.strip()[:200]}"


@lru_cache(maxsize=1)
def sizes_tmpfs() -> bool:
    """This bubblewrap can cap a tmpfs's size (--size, bubblewrap 0.7 and later)."""
    exe = shutil.which("bwrap")
    try:
        text = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=10).stdout if exe else ""
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--size" in text


def toolchain_paths() -> list[Path]:
    """The interpreter and packages the agent's commands use: this Python's venv and base install."""
    found = []
    for p in (sys.prefix, sys.base_prefix):
        real = Path(p).resolve()
        if real not in found:
            found.append(real)
    return found


def sandbox_path() -> str:
    """PATH inside the sandbox: the toolchain's bin first, then the usual system directories."""
    venv_bin = str(Path(sys.prefix).resolve() / "bin")
    return ":".join([venv_bin, "/usr/local/cuda/bin", "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin",
                     "/sbin", "/bin"])


def bwrap_prefix(root: Path, tmp: Path, hide: Iterable[Path], shm_mb: int) -> list[str]:
    """bwrap arguments that run a command with root at WORKDIR, tmp at /tmp, no network, no other processes,
    the system directories and the toolchain read-only, and every path in hide that would be visible masked
    (a directory by an empty tmpfs, a file by /dev/null)."""
    # --cap-drop ALL: run as root, bubblewrap would otherwise keep every capability (remount, mount, ...)
    args = ["bwrap", "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--proc", "/proc", "--dev", "/dev"]
    args += (["--size", str(shm_mb * MIB)] if sizes_tmpfs() else []) + ["--tmpfs", "/dev/shm"]
    for top in SYSTEM_DIRS:
        p = Path(top)
        if p.is_symlink():
            args += ["--symlink", os.readlink(p), top]
        elif p.is_dir():
            args += ["--ro-bind", top, top]
    tools = toolchain_paths()
    masks = [Path(h).resolve() for h in hide]
    masks = sorted({m for m in masks if m.exists()} | {m.with_name(m.name + ".wal") for m in masks if m.is_file()
                                                         and m.with_name(m.name + ".wal").exists()})
    late = [m for m in masks if any(m.is_relative_to(t) for t in tools)]
    early = _outermost([m for m in masks if m not in late and any(m.is_relative_to(t) for t in SYSTEM_DIRS)])
    late = _outermost(late)
    args += _masks(early)
    # /tmp first: a toolchain that lives under /tmp (a checkout there, as in CI) is bound on top of it
    args += ["--bind", str(tmp), "/tmp"]
    for tool in tools:
        args += ["--ro-bind", str(tool), str(tool)]
    args += _masks(late)
    args += ["--bind", str(root), WORKDIR]
    # Run as root, bubblewrap's new root, its /dev and the masks are writable tmpfs of the host's RAM size: read-only
    for top in ["/dev", *(str(m) for m in early + late if m.is_dir()), "/"]:
        args += ["--remount-ro", top]
    return args + ["--chdir", WORKDIR, "--"]


def _outermost(masks: list[Path]) -> list[Path]:
    """The masks not inside another directory mask of the same phase: the outer empty tmpfs already hides them,
    and mounting one there would leave an empty mount point to be seen (e.g. problems/solutions in the checkout)."""
    return [m for m in masks if not any(o != m and o.is_dir() and m.is_relative_to(o) for o in masks)]


def _masks(paths: Iterable[Path]) -> list[str]:
    args: list[str] = []
    for p in paths:
        args += ["--tmpfs", str(p)] if p.is_dir() else ["--ro-bind", "/dev/null", str(p)]
    return args
