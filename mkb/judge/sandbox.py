"""Child processes of the judge: own session, resource limits, no network, capped output, hard kill.

Each judge process starts in a new session (its own process group), so a timeout kills the
whole group with one killpg. The candidate process additionally gets CPU-time and file-size
limits, a memory limit (RLIMIT_AS on CPU; on a GPU a parent-side RSS watchdog, because CUDA
reserves far more virtual address space than it uses and would fail under RLIMIT_AS), and no
network (a fresh network namespace through `unshare -n`, or `unshare -rn` / `bwrap` where that
is what works). What is in force is reported in every record; when no network isolation is
available the judge says so loudly and runs anyway.
"""

from __future__ import annotations

import logging
import os
import resource
import shutil
import signal
import subprocess
import threading
from collections import deque
from dataclasses import dataclass, field
from functools import lru_cache

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    """Resource limits of one child process."""

    memory_mb: int | None = None
    """Memory limit; enforced with RLIMIT_AS unless watch_rss is set."""
    watch_rss: bool = False
    """Enforce memory_mb by polling resident memory instead of RLIMIT_AS (CUDA processes)."""
    cpu_s: int | None = None
    """CPU-time limit (RLIMIT_CPU)."""
    file_bytes: int | None = None
    """Largest file the process may write (RLIMIT_FSIZE)."""
    isolate_network: bool = False
    """Run in a fresh network namespace when the machine allows it."""


@lru_cache(maxsize=1)
def network_isolation() -> tuple[tuple[str, ...], str]:
    """(command prefix, description) of the network isolation this machine supports."""
    candidates = [(("unshare", "-n"), "unshare -n (new network namespace)"),
                  (("unshare", "-rn"), "unshare -rn (user + network namespace)"),
                  (("bwrap", "--unshare-net", "--die-with-parent", "--dev-bind", "/", "/"),
                   "bwrap --unshare-net")]
    for prefix, description in candidates:
        if shutil.which(prefix[0]) is None:
            continue
        try:
            probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            return prefix, description
    log.warning("no network isolation available (unshare/bwrap refused); the candidate runs WITH network access")
    return (), "none: unshare and bwrap are unavailable or refused here"


class Tail:
    """Drains a pipe on a thread, keeping only the last `limit` bytes (a 100 MB print costs nothing)."""

    def __init__(self, stream, limit: int):
        self.chunks: deque[bytes] = deque()
        self.size, self.total, self.limit = 0, 0, limit
        self.thread = threading.Thread(target=self._drain, args=(stream,), daemon=True)
        self.thread.start()

    def _drain(self, stream) -> None:
        while chunk := stream.read1(1 << 16) if hasattr(stream, "read1") else stream.read(1 << 16):
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


@dataclass
class Child:
    """A running judge child: its process, captured output and the limits it runs under."""

    name: str
    popen: subprocess.Popen
    stdout: Tail
    stderr: Tail
    limits: Limits
    isolation: dict = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def kill(self) -> None:
        """Kill the child's whole process group (it leads its own session)."""
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def rss_mb(self) -> float:
        try:
            with open(f"/proc/{self.pid}/status") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024
        except OSError:
            pass
        return 0.0

    def over_memory(self) -> bool:
        return bool(self.limits.watch_rss and self.limits.memory_mb and self.rss_mb() > self.limits.memory_mb)

    def describe_exit(self) -> str:
        code = self.popen.returncode
        if code is None:
            return "still running"
        if code < 0:
            try:
                return f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with code {code}"


def _apply_limits(limits: Limits) -> None:
    """Runs in the child between fork and exec."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if limits.memory_mb and not limits.watch_rss:
        size = limits.memory_mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (size, size))
    if limits.cpu_s:
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 5))
    if limits.file_bytes:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))


def start(name: str, argv: list[str], *, env: dict, cwd: str, limits: Limits, pass_fds: tuple[int, ...],
          output_limit: int) -> Child:
    """Start one child in its own session with the given limits; its output is drained and capped."""
    prefix, network = network_isolation() if limits.isolate_network else ((), "not requested")
    popen = subprocess.Popen([*prefix, *argv], env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, pass_fds=pass_fds, start_new_session=True,
                             preexec_fn=lambda: _apply_limits(limits))
    memory = (f"RSS watchdog {limits.memory_mb} MiB" if limits.watch_rss else f"RLIMIT_AS {limits.memory_mb} MiB") \
        if limits.memory_mb else "none"
    isolation = {"session": "own session, process group killed on timeout", "network": network,
                 "memory": memory, "cpu_s": limits.cpu_s, "file_bytes": limits.file_bytes,
                 "output_bytes_kept": output_limit}
    return Child(name, popen, Tail(popen.stdout, output_limit), Tail(popen.stderr, output_limit), limits, isolation)
