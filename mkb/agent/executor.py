"""Workspace executors: run the agent's commands and file operations, isolated (interface + local backend)."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Protocol

from mkb.agent.bwrap import SYSTEM_DIRS, WORKDIR, bwrap_prefix, bwrap_problem, sandbox_path, sizes_tmpfs
from mkb.agent.cgroups import open_cgroup
from mkb.agent.diskwatch import DiskWatch
from mkb.agent.limits import SandboxLimits, apply_rlimits, capped_cpus, host_cpus, rlimits
from mkb.agent.sandboxes import isolation_problem, refusal
from mkb.settings import environment, load_settings

log = logging.getLogger(__name__)

__all__ = ["SYSTEM_DIRS", "WORKDIR", "ExecResult", "Executor", "LocalExecutor", "bwrap_problem"]

MAX_FILE_BYTES = 10_000_000
"""read_file refuses larger files (the model could not use them anyway)."""
ENV_ALLOW = ("LANG", "LC_ALL", "LC_CTYPE", "TZ", "CUDA_HOME", "CUDA_PATH")
"""The only host variables a sandboxed command inherits; everything else (API keys) stays out."""


@dataclass(frozen=True)
class ExecResult:
    """What one command did."""

    exit_code: int | None
    """Exit status; None when the command was killed at its time limit."""
    output: str
    """stdout and stderr interleaved, capped: head and tail kept around an omission marker."""
    timed_out: bool
    """The time limit was reached and every process of the command was killed."""
    omitted_bytes: int = 0
    """Bytes of output dropped from the middle."""
    duration_s: float = 0.0
    """Wall-clock seconds the command ran."""


class Executor(Protocol):
    """One attempt's workspace: run commands in it and read/write its files.

    Paths are relative to the workspace; an absolute path must lie inside `workdir`.
    """

    isolation: str
    """What isolates commands: bwrap, docker:<image>, or subprocess (none)."""
    workdir: str
    """The workspace directory as commands see it (their working directory)."""
    limits: dict[str, str]
    """What caps the attempt's commands, per limit (memory, pids, cpus, disk, shm), as recorded in the transcript."""

    def exec(self, command: str, timeout_s: float, output_limit: int = 20_000) -> ExecResult:
        """Run a bash command in the workspace; kill it and everything it started after timeout_s."""
        ...

    def read_file(self, path: str) -> str:
        """A workspace file's text (UTF-8, undecodable bytes replaced).

        Raises:
            FileNotFoundError: no such file. IsADirectoryError: a directory.
            PermissionError: the path leaves the workspace. ValueError: over MAX_FILE_BYTES.
        """
        ...

    def write_file(self, path: str, text: str) -> None:
        """Create or replace a workspace file, creating parent directories.

        Raises:
            PermissionError: the path leaves the workspace. IsADirectoryError: a directory is there.
        """
        ...

    def close(self) -> None:
        """Release the sandbox (container, processes); the executor is unusable afterwards."""
        ...


def relative_path(path: str, workdir: str) -> str:
    """Normalise a tool path to one relative to the workspace.

    Raises:
        PermissionError: it points outside the workspace.
    """
    pure = PurePosixPath(path.strip())
    if pure.is_absolute():
        try:
            pure = pure.relative_to(workdir)
        except ValueError:
            raise PermissionError(f"{path} is outside the workspace ({workdir})") from None
    parts: list[str] = []
    for part in pure.parts:
        if part == "..":
            if not parts:
                raise PermissionError(f"{path} is outside the workspace ({workdir})")
            parts.pop()
        elif part not in (".", ""):
            parts.append(part)
    if not parts:
        raise IsADirectoryError(f"{path} is the workspace directory itself")
    return "/".join(parts)


class OutputCapture:
    """Keeps the first and last limit/2 bytes of a stream, counting what falls in between."""

    def __init__(self, limit: int):
        self.half = max(1, limit // 2)
        self.head = bytearray()
        self.tail: deque[bytes] = deque()
        self.tail_bytes = 0
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail.append(chunk)
            self.tail_bytes += len(chunk)
            while self.tail_bytes - len(self.tail[0]) >= self.half:
                self.tail_bytes -= len(self.tail.popleft())

    def drain(self, stream) -> None:
        """Read a binary file object (or an iterator of byte chunks) to its end."""
        chunks = iter(lambda: stream.read1(65536), b"") if hasattr(stream, "read1") else stream
        for chunk in chunks:
            self.add(chunk)

    def result(self) -> tuple[str, int]:
        tail = b"".join(self.tail)[-self.half:] if self.tail else b""
        omitted = self.total - len(self.head) - len(tail)
        text = bytes(self.head).decode("utf-8", "replace")
        if omitted > 0:
            text += f"\n[... {omitted} bytes of output omitted ...]\n"
        return text + tail.decode("utf-8", "replace"), max(0, omitted)


def child_env(path: str | None = None, home: str = "/tmp") -> dict[str, str]:
    """The whole environment of a sandboxed command, built from an allow-list (no keys, no GPU)."""
    host = environment()
    env = {k: host[k] for k in ENV_ALLOW if k in host}
    env.update(HOME=home, TMPDIR=home, CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1", TERM="dumb")
    if path is not None:
        env["PATH"] = path
    return env


class LocalExecutor:
    """Commands run on this host under bubblewrap (no network, private /proc, only system dirs, the toolchain
    and the workspace visible) in a cgroup that caps memory, processes and CPU where one can be made, with
    the workspace and /tmp watched against the disk limit. Where bubblewrap cannot run (or isolate is off)
    they run as plain subprocesses (isolation = 'subprocess') only if allow_unsafe says so.
    """

    def __init__(self, workspace: Path, *, isolate: bool = True, allow_unsafe: bool = False,
                 hide: tuple[Path, ...] = (), limits: SandboxLimits = SandboxLimits(), cgroup: bool = True):
        """Args:
            allow_unsafe: run commands unisolated where bubblewrap cannot isolate them (MKB_UNSAFE_SANDBOX).
            cgroup: put the attempt in a cgroup of its own where this process may make one; False leaves only
                the per-process limits (RLIMIT_AS for memory; no process or CPU cap).
            hide: host paths to mask in addition to the mkb checkout, MKB_HOME, the database, the problems and
                the solutions; only needed where they lie under a directory the sandbox shows.

        Raises:
            SandboxRefused: no isolation is possible (or isolate is off) and allow_unsafe is not set.
        """
        problem = isolation_problem(isolate)
        if problem is not None and not allow_unsafe:
            raise refusal(problem)
        self.root = Path(workspace).resolve()
        self.tmp = self.root.parent / (self.root.name + ".tmp")
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.sandbox_limits = limits
        cpus, cpus_note = capped_cpus(limits, host_cpus())
        self.cgroup, cgroup_note = open_cgroup(limits, cpus) if cgroup else (None, "no cgroup was asked for")
        self._rlimits = rlimits(limits, memory=self.cgroup is None)
        if problem is None:
            self.isolation, self.workdir = "bwrap", WORKDIR
            self._prefix = bwrap_prefix(self.root, self.tmp, (*_private_paths(), *hide), limits.shm_mb)
            self._env = child_env(sandbox_path(), home="/tmp")
        else:
            log.warning("NO SANDBOX (MKB_UNSAFE_SANDBOX is set): %s. The agent's commands run as plain subprocesses "
                        "WITH network access and the host's files and processes visible.", problem)
            self.isolation, self.workdir = "subprocess", str(self.root)
            self._prefix = []
            self._env = child_env(sandbox_path(), home=str(self.tmp))
        self.limits = self._describe(limits, cpus_note, cgroup_note)

    def _describe(self, limits: SandboxLimits, cpus_note: str, cgroup_note: str) -> dict[str, str]:
        by = self.cgroup and f"cgroup v{self.cgroup.version}"
        shm = (f"tmpfs of {limits.shm_mb} MiB" if sizes_tmpfs() else "tmpfs, size not capped (bubblewrap < 0.7)") \
            if self.isolation == "bwrap" else "the host's /dev/shm, not capped"
        return {"memory": f"{limits.memory_mb} MiB for all processes ({by})" if by else
                f"{limits.memory_mb} MiB address space per process (RLIMIT_AS; {cgroup_note})",
                "pids": f"{limits.pids} ({by})" if by else f"not capped ({cgroup_note})",
                "cpus": f"{cpus_note} ({by})" if by else f"not capped ({cgroup_note})",
                "disk": f"workspace and /tmp {limits.disk_mb} MiB and {limits.files} files each (watched), "
                        f"files up to {limits.disk_mb} MiB",
                "shm": shm, "strays": "killed with the command (" + (
                    "PID namespace" if self.isolation == "bwrap" else by or f"not tracked: {cgroup_note}") + ")"}

    def _enter(self) -> None:
        """Runs in the child between fork and exec."""
        if self.cgroup is not None:
            self.cgroup.enter()
        apply_rlimits(self._rlimits)

    def exec(self, command: str, timeout_s: float, output_limit: int = 20_000) -> ExecResult:
        started = time.monotonic()
        oom_before = self.cgroup.oom_kills() if self.cgroup else 0
        launched: list[int] = []
        disk = DiskWatch({"the workspace": self.root, "/tmp": self.tmp}, self.sandbox_limits,
                         lambda: [self._stop(pid) for pid in launched])
        proc = subprocess.Popen([*self._prefix, "bash", "-c", command], cwd=self.root, env=self._env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=self._enter)
        launched.append(proc.pid)
        capture = OutputCapture(output_limit)
        reader = threading.Thread(target=capture.drain, args=(proc.stdout,), daemon=True)
        reader.start()
        with disk:
            try:
                exit_code, timed_out = proc.wait(timeout=max(0.01, timeout_s)), False
            except subprocess.TimeoutExpired:
                exit_code, timed_out = None, True
            self._stop(proc.pid)  # also ends background jobs left behind by a command that exited
        proc.wait()
        reader.join(timeout=2.0)  # a plain-subprocess job that left the group may hold the pipe
        if not reader.is_alive():
            proc.stdout.close()
        output, omitted = capture.result()
        output += "".join(f"\n[{note}]\n" for note in self._notices(disk.notices, oom_before))
        return ExecResult(exit_code, output, timed_out, omitted, time.monotonic() - started)

    def _stop(self, pid: int) -> None:
        _kill_group(pid)
        if self.cgroup is not None:
            self.cgroup.kill_all()

    def _notices(self, disk: list[str], oom_before: int) -> list[str]:
        notes = list(disk)
        if self.cgroup is not None and self.cgroup.oom_kills() > oom_before:
            notes.append(f"a process was killed for passing the sandbox's memory limit ({self.limits['memory']})")
        return notes

    def _host_path(self, path: str) -> Path:
        rel = relative_path(path, self.workdir)
        try:
            target = (self.root / rel).resolve()
        except RuntimeError:  # a symlink loop the agent made (Python < 3.13 raises this, naming the host path)
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path) from None
        if not target.is_relative_to(self.root):
            raise PermissionError(f"{path} resolves outside the workspace")
        return target

    def read_file(self, path: str) -> str:
        target = self._host_path(path)
        if target.is_dir():
            raise IsADirectoryError(f"{path} is a directory")
        if target.stat().st_size > MAX_FILE_BYTES:
            raise ValueError(f"{path} is larger than {MAX_FILE_BYTES} bytes")
        return target.read_bytes().decode("utf-8", "replace")

    def write_file(self, path: str, text: str) -> None:
        target = self._host_path(path)
        if target.is_dir():
            raise IsADirectoryError(f"{path} is a directory")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")

    def close(self) -> None:
        if self.cgroup is not None:
            self.cgroup.remove()
        shutil.rmtree(self.tmp, ignore_errors=True)


def _private_paths() -> tuple[Path, ...]:
    """What an agent must never read: the mkb checkout (grader code), MKB_HOME (results, other attempts),
    the results database, the problems tree (solutions)."""
    settings = load_settings()
    return (Path(__file__).resolve().parents[2], settings.home, settings.db_path, settings.problems_dir,
            settings.solutions_path)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
