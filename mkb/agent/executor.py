"""Workspace executors: run the agent's commands and file operations, isolated (interface + local backend)."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import Protocol

from mkb.settings import environment, load_settings

log = logging.getLogger(__name__)

WORKDIR = "/workspace"
"""Where the workspace appears inside an isolated sandbox (bubblewrap, Docker)."""
MAX_FILE_BYTES = 10_000_000
"""read_file refuses larger files (the model could not use them anyway)."""
ENV_ALLOW = ("LANG", "LC_ALL", "LC_CTYPE", "TZ", "CUDA_HOME", "CUDA_PATH")
"""The only host variables a sandboxed command inherits; everything else (API keys) stays out."""
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")
"""Host directories a bubblewrap sandbox sees, read-only, besides the toolchain and the workspace."""


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


def toolchain_paths() -> list[Path]:
    """The interpreter and packages the agent's commands use: this Python's venv and base install."""
    found = []
    for p in (sys.prefix, sys.base_prefix):
        real = Path(p).resolve()
        if real not in found:
            found.append(real)
    return found


@lru_cache(maxsize=1)
def bwrap_problem() -> str | None:
    """Why bubblewrap cannot isolate commands here, or None when it can."""
    exe = shutil.which("bwrap")
    if exe is None:
        return "bwrap is not installed (apt-get install bubblewrap)"
    try:
        probe = subprocess.run([exe, "--unshare-net", "--unshare-pid", "--ro-bind", "/", "/", "--proc", "/proc",
                                "--dev", "/dev", "true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap failed to start: {exc}"
    return None if probe.returncode == 0 else f"bwrap cannot create namespaces: {probe.stderr.strip()[:200]}"


class LocalExecutor:
    """Commands run on this host under bubblewrap (no network, private /proc, only system dirs, the
    toolchain and the workspace visible), or, where bubblewrap cannot run, as plain subprocesses with
    a loud warning and isolation = 'subprocess'.
    """

    def __init__(self, workspace: Path, *, isolate: bool = True, hide: tuple[Path, ...] = ()):
        """Args:
            hide: host directories to mask (empty tmpfs) in addition to the mkb checkout, MKB_HOME, the
                problems and the solutions; only needed where they lie under a SYSTEM_DIRS directory.
        """
        self.root = Path(workspace).resolve()
        self.tmp = self.root.parent / (self.root.name + ".tmp")
        self.tmp.mkdir(parents=True, exist_ok=True)
        problem = bwrap_problem() if isolate else "isolation was switched off"
        if problem is None:
            self.isolation, self.workdir = "bwrap", WORKDIR
            self._prefix = self._bwrap_prefix((*_private_paths(), *hide))
            self._env = child_env(_sandbox_path(), home="/tmp")
        else:
            log.warning("NO SANDBOX: %s. The agent's commands run as plain subprocesses WITH network access "
                        "and the host's files visible (their environment is still filtered).", problem)
            self.isolation, self.workdir = "subprocess", str(self.root)
            self._prefix = []
            self._env = child_env(_sandbox_path(), home=str(self.tmp))

    def _bwrap_prefix(self, hide: tuple[Path, ...]) -> list[str]:
        # --cap-drop ALL: run as root, bubblewrap would otherwise keep every capability (remount, mount, ...)
        args = ["bwrap", "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent",
                "--new-session", "--cap-drop", "ALL", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/dev/shm"]
        for top in SYSTEM_DIRS:
            p = Path(top)
            if p.is_symlink():
                args += ["--symlink", os.readlink(p), top]
            elif p.is_dir():
                args += ["--ro-bind", top, top]
        for hidden in hide:
            h = Path(hidden).resolve()
            if h.is_dir() and any(h.is_relative_to(top) for top in SYSTEM_DIRS):
                args += ["--tmpfs", str(h)]
        # /tmp first: a toolchain that lives under /tmp (a checkout there, as in CI) is bound on top of it
        args += ["--bind", str(self.tmp), "/tmp"]
        for tool in toolchain_paths():
            args += ["--ro-bind", str(tool), str(tool)]
        return args + ["--bind", str(self.root), WORKDIR, "--chdir", WORKDIR, "--"]

    def exec(self, command: str, timeout_s: float, output_limit: int = 20_000) -> ExecResult:
        started = time.monotonic()
        proc = subprocess.Popen([*self._prefix, "bash", "-c", command], cwd=self.root, env=self._env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        capture = OutputCapture(output_limit)
        reader = threading.Thread(target=capture.drain, args=(proc.stdout,), daemon=True)
        reader.start()
        try:
            exit_code, timed_out = proc.wait(timeout=max(0.01, timeout_s)), False
        except subprocess.TimeoutExpired:
            exit_code, timed_out = None, True
        _kill_group(proc.pid)  # also ends background jobs left behind by a command that exited
        proc.wait()
        reader.join(timeout=2.0)  # a plain-subprocess job that left the group may hold the pipe
        if not reader.is_alive():
            proc.stdout.close()
        output, omitted = capture.result()
        return ExecResult(exit_code, output, timed_out, omitted, time.monotonic() - started)

    def _host_path(self, path: str) -> Path:
        rel = relative_path(path, self.workdir)
        target = (self.root / rel).resolve()
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
        shutil.rmtree(self.tmp, ignore_errors=True)


def _private_paths() -> tuple[Path, ...]:
    """What an agent must never read: the mkb checkout (grader code), MKB_HOME (results, other attempts),
    the problems tree (solutions)."""
    settings = load_settings()
    return (Path(__file__).resolve().parents[2], settings.home, settings.problems_dir, settings.solutions_path)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _sandbox_path() -> str:
    venv_bin = str(Path(sys.prefix).resolve() / "bin")
    return ":".join([venv_bin, "/usr/local/cuda/bin", "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin",
                     "/sbin", "/bin"])
