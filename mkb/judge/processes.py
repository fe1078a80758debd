"""The judge's child processes: started from one thread, own session, limits, capped output, hard kill.

Each judge process starts in a new session (its own process group), so one killpg ends it and
whatever it started there; in the sandbox, its PID namespace ends with it (launch.py). Every
process gets PR_SET_PDEATHSIG (SIGKILL): the kernel sends it when the *thread* that forked the
process exits, not the process, so all judge processes are started from one long-lived thread of
the judge's process (the spawner) and die with that process, however it ends (SIGTERM, kill -9).
bwrap's --die-with-parent rests on the same mechanism.

The candidate's limits: CPU time and file size (rlimits), memory (RLIMIT_AS on CPU; always a
watchdog summing the resident memory of its whole process tree and the files in its sandbox's tmpfs
mounts, since CUDA reserves far more address space than it uses and files in RAM are in no RSS), and
the number of processes and threads in its tree.
"""

from __future__ import annotations

import ctypes
import os
import queue
import resource
import signal
import subprocess
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class Limits:
    """Resource limits of one child process."""

    memory_mb: int | None = None
    """Memory of the process tree (watchdog); also RLIMIT_AS unless address_space is False."""
    address_space: bool = True
    """Enforce memory_mb with RLIMIT_AS too (not for CUDA processes, which reserve far more than they use)."""
    cpu_s: int | None = None
    """CPU-time limit (RLIMIT_CPU)."""
    file_bytes: int | None = None
    """Largest file the process may write (RLIMIT_FSIZE)."""
    max_processes: int | None = None
    """Processes the tree may hold at once (watchdog)."""
    max_threads: int | None = None
    """Threads (tasks) the tree may hold at once (watchdog): each takes a pid of the host's."""


HEAD_BYTES = 4096
"""What a Tail keeps of the start of its output besides the tail: the first error often comes long before the end."""


class Tail:
    """Drains a pipe on a thread, keeping only the last `limit` bytes (a 100 MB print costs nothing) and the first
    HEAD_BYTES."""

    def __init__(self, stream, limit: int):
        self.first = b""
        self.chunks: deque[bytes] = deque()
        self.size, self.total, self.limit = 0, 0, limit
        self.thread = threading.Thread(target=self._drain, args=(stream,), daemon=True)
        self.thread.start()

    def _drain(self, stream) -> None:
        while chunk := stream.read1(1 << 16) if hasattr(stream, "read1") else stream.read(1 << 16):
            if len(self.first) < HEAD_BYTES:
                self.first += chunk[:HEAD_BYTES - len(self.first)]
            self.chunks.append(chunk)
            self.size += len(chunk)
            self.total += len(chunk)
            while self.size - len(self.chunks[0]) >= self.limit and len(self.chunks) > 1:
                self.size -= len(self.chunks.popleft())
        stream.close()

    def text(self, wait_s: float = 2.0, max_bytes: int | None = None) -> str:
        """The kept tail (at most max_bytes of it), marked when earlier output was discarded."""
        self.thread.join(wait_s)
        data = b"".join(self.chunks)[-min(self.limit, max_bytes or self.limit):]
        dropped = self.total - len(data)
        prefix = f"[... {dropped} earlier bytes discarded ...]\n" if dropped > 0 else ""
        return prefix + data.decode("utf-8", "replace")

    def head(self, max_bytes: int = HEAD_BYTES, wait_s: float = 2.0) -> str:
        """The first max_bytes of the output (at most HEAD_BYTES)."""
        self.thread.join(wait_s)
        return self.first[:max_bytes].decode("utf-8", "replace")


@dataclass
class Child:
    """A running judge child: its process, captured output and the limits it runs under."""

    name: str
    popen: subprocess.Popen
    stdout: Tail
    stderr: Tail
    limits: Limits
    isolation: dict = field(default_factory=dict)
    sandboxed: bool = False
    """Started through bwrap, which reports a command killed by signal N as exit code 128 + N."""

    @property
    def pid(self) -> int:
        return self.popen.pid

    def kill(self) -> None:
        """Kill the child's whole process group (it leads its own session)."""
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def over_limits(self) -> str | None:
        """Why the child's process tree must be killed now (memory, processes), or None."""
        tree = descendants(self.pid)
        if self.limits.max_processes and len(tree) > self.limits.max_processes:
            return f"started more than {self.limits.max_processes} processes"
        if self.limits.max_threads and sum(tree.values()) > self.limits.max_threads:
            return f"started more than {self.limits.max_threads} threads"
        if self.limits.memory_mb and sum(rss_mb(p) for p in tree) + self.tmpfs_mb(tree) > self.limits.memory_mb:
            return f"exceeded the {self.limits.memory_mb} MiB memory limit (resident memory and files in its tmpfs)"
        return None

    def tmpfs_mb(self, tree: dict[int, int]) -> float:
        """MiB of files in the cell's /tmp and the grading's /dev/shm (RAM that RSS does not show); 0 unsandboxed.

        Seen through /proc/<pid>/root: the sandbox's monitor (this child) lives in the grading's namespace,
        its only child (the cell's first process) in the cell's."""
        cell = next((p for p in tree if p != self.pid), None)
        if not self.sandboxed or cell is None:
            return 0.0
        host = _devices("/", "/tmp", "/dev/shm")
        return (_used_bytes(f"/proc/{cell}/root/tmp", host)
                + _used_bytes(f"/proc/{self.pid}/root/dev/shm", host)) / 2**20

    def describe_exit(self) -> str:
        code = self.popen.returncode
        if code is None:
            return "still running"
        if code < 0 or (self.sandboxed and code > 128):
            number = -code if code < 0 else code - 128
            try:
                return f"was killed by {signal.Signals(number).name}"
            except ValueError:
                return f"was killed by signal {number}"
        return f"exited with code {code}"


def descendants(pid: int) -> dict[int, int]:
    """pid and every process below it, each with its number of threads (from /proc/<pid>/task/<tid>/children;
    orphans in a PID namespace are adopted by its init, so the tree from the sandbox's monitor holds the
    whole namespace)."""
    found, todo = {}, [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        found[p] = len(tasks)
        for task in tasks:
            try:
                with open(f"/proc/{p}/task/{task}/children") as fh:
                    todo += [int(c) for c in fh.read().split()]
            except (OSError, ValueError):
                continue
    return found


def alive(pid: int) -> bool:
    """The process exists and has not exited (a zombie has released its memory and its CUDA context)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_gone(pids: set[int], wait_s: float) -> set[int]:
    """Wait up to wait_s for every pid to have exited; the ones still running then."""
    deadline = time.monotonic() + wait_s
    while (left := {p for p in pids if alive(p)}) and time.monotonic() < deadline:
        time.sleep(0.01)
    return left


def _devices(*paths: str) -> set[int]:
    found = set()
    for path in paths:
        try:
            found.add(os.stat(path).st_dev)
        except OSError:
            pass
    return found


def _used_bytes(path: str, host: set[int]) -> int:
    """Bytes used on the filesystem at path; 0 when it is one of the host's (`host`: their st_dev), as it is while a
    sandbox's process has not yet entered its own mounts: its /tmp is then the host's disk, whose use is not the
    candidate's (a relief process caught starting was once charged the host disk's 44 GB and killed)."""
    try:
        if os.stat(path).st_dev in host:
            return 0
        fs = os.statvfs(path)
    except OSError:
        return 0
    return (fs.f_blocks - fs.f_bfree) * fs.f_frsize


def rss_mb(pid: int) -> float:
    """Resident memory of one process (shared memory it maps included), in MiB; 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return 0.0


def _prepare_child(limits: Limits, parent: int) -> None:
    """Runs in the child between fork and exec: die with the judge, then the limits."""
    _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the judge died before the signal was armed
        os._exit(1)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if limits.memory_mb and limits.address_space:
        size = limits.memory_mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (size, size))
    if limits.cpu_s:
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 5))
    if limits.file_bytes:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))


class _Spawner:
    """One daemon thread that forks every judge process, so their parent-death signal follows the process."""

    def __init__(self) -> None:
        self.jobs: queue.Queue = queue.Queue()
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    def run(self, job: Callable[[], subprocess.Popen]) -> subprocess.Popen:
        with self.lock:
            if self.thread is None:
                self.thread = threading.Thread(target=self._serve, name="mkb-judge-spawner", daemon=True)
                self.thread.start()
        done: Future = Future()
        self.jobs.put((job, done))
        return done.result()

    def _serve(self) -> None:
        while True:
            job, done = self.jobs.get()
            try:
                done.set_result(job())
            except BaseException as exc:  # handed to the caller, who raises it
                done.set_exception(exc)


_SPAWNER = _Spawner()


def start(name: str, argv: list[str], *, env: dict, cwd: str, limits: Limits, pass_fds: tuple[int, ...],
          output_limit: int, isolation: dict, sandboxed: bool) -> Child:
    """Start one child in its own session with the given limits; its output is drained and capped."""
    parent = os.getpid()
    popen = _SPAWNER.run(lambda: subprocess.Popen(
        argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        pass_fds=pass_fds, start_new_session=True, preexec_fn=lambda: _prepare_child(limits, parent)))
    memory = "none"
    if limits.memory_mb:
        memory = (f"{limits.memory_mb} MiB: watchdog of the process tree's RSS and its tmpfs files"
                  + (" and RLIMIT_AS" if limits.address_space else ""))
    facts = {"session": "own session, process group killed at the end, SIGKILL when the judge dies",
             "memory": memory, "cpu_s": limits.cpu_s, "file_bytes": limits.file_bytes,
             "max_processes": limits.max_processes, "max_threads": limits.max_threads,
             "output_bytes_kept": output_limit, **isolation}
    return Child(name, popen, Tail(popen.stdout, output_limit), Tail(popen.stderr, output_limit), limits, facts,
                 sandboxed)
