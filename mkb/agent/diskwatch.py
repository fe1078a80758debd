"""The local sandbox's disk limit: while a command runs, the workspace and /tmp are walked, and the command is
killed once one of them holds more than the limit in bytes or files, or a tree deeper than MAX_DEPTH.

The walk goes by directory file descriptors (no path is longer than one name, so nothing hides past
PATH_MAX), makes directories that a command made unreadable readable again (they are the runner's own
files), and counts allocated blocks (a sparse file counts what it uses). Deeper trees are removed.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mkb.agent.limits import MIB, SandboxLimits

MAX_DEPTH = 64
"""Directory levels the walk follows; a deeper tree breaks the disk limit (no toolchain needs one)."""


@dataclass
class Usage:
    """What one directory holds."""

    bytes: int = 0
    entries: int = 0
    too_deep: list[str] = field(default_factory=list)
    """Top-level entries holding a tree deeper than MAX_DEPTH, or one the walk cannot open."""


def usage(root: Path, inodes: set[tuple[int, int]] | None = None) -> Usage:
    """Walk root without following links; each entry's (device, inode) goes into inodes when it is given."""
    found = Usage()
    top = _open_dir(str(root), None)
    if top is None:
        return found
    stack = [(top, os.scandir(top), "")]
    try:
        while stack:
            fd, entries, top_name = stack[-1]
            entry = next(entries, None)
            if entry is None:
                entries.close()
                os.close(fd)
                stack.pop()
                continue
            found.entries += 1
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if inodes is not None:
                inodes.add((st.st_dev, st.st_ino))
            if not stat.S_ISDIR(st.st_mode):
                found.bytes += st.st_blocks * 512
                continue
            name = top_name or entry.name
            child = _open_dir(entry.name, fd) if len(stack) < MAX_DEPTH else None
            if child is None:
                found.too_deep += [] if name in found.too_deep else [name]
            else:
                stack.append((child, os.scandir(child), name))
    finally:
        for fd, entries, _ in stack:
            entries.close()
            os.close(fd)
    return found


def _open_dir(name: str, parent: int | None) -> int | None:
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    try:
        return os.open(name, flags, dir_fd=parent)
    except PermissionError:  # chmod 000 by the command: through an O_PATH descriptor, so no link is followed
        try:
            handle = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
            try:
                os.chmod(f"/proc/self/fd/{handle}", 0o700)
            finally:
                os.close(handle)
            return os.open(name, flags, dir_fd=parent)
        except OSError:
            return None
    except OSError:
        return None


def remove_new(root: Path, keep: set[tuple[int, int]]) -> int:
    """Remove every entry under root whose (device, inode) is not in keep (a new folder goes whole); how many
    files or folders went (a folder counts once). Walks by descriptors, as usage() does, and never follows a link."""
    removed = 0
    top = _open_dir(str(root), None)
    if top is None:
        return 0
    stack = [top]
    try:
        while stack:
            fd = stack.pop()
            try:
                with os.scandir(fd) as entries:
                    found = list(entries)
                for entry in found:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if (st.st_dev, st.st_ino) in keep:
                        child = _open_dir(entry.name, fd) if stat.S_ISDIR(st.st_mode) and len(stack) < MAX_DEPTH \
                            else None
                        stack += [child] if child is not None else []
                        continue
                    removed += _remove(entry.name, fd, stat.S_ISDIR(st.st_mode))
            finally:
                os.close(fd)
    finally:
        for fd in stack:
            os.close(fd)
    return removed


def _remove(name: str, parent: int, is_dir: bool) -> int:
    try:
        if not is_dir:
            os.unlink(name, dir_fd=parent)
            return 1
        try:
            shutil.rmtree(name, dir_fd=parent)
        except OSError:  # a folder the command made unreadable: the walk makes it readable, then again
            usage(Path(f"/proc/self/fd/{parent}") / name)
            shutil.rmtree(name, dir_fd=parent)
        return 1
    except OSError:
        return 0


class DiskWatch:
    """Polls directories while a command runs and calls on_over once when one has grown past max(its limit,
    what it held when the command started), in bytes or in files, or holds a tree deeper than MAX_DEPTH: a
    command can always delete, never grow a directory that is over a limit. The overshoot is what the command
    writes within one poll (each file is also capped by RLIMIT_FSIZE); a command that ends before the next poll
    is checked at its end. Either way, what the command created in a directory it left over a limit is removed
    at its end (files and folders that were there before it stay), so no command leaves more files behind than
    the limit, however fast it writes. Too deep trees are removed on entry and exit.
    """

    def __init__(self, dirs: dict[str, Path], limits: SandboxLimits, on_over: Callable[[], None],
                 interval_s: float = 0.2):
        """Args:
            dirs: what each directory is called in notices (e.g. "the workspace", "/tmp") -> its host path.
        """
        self.dirs = {label: Path(d) for label, d in dirs.items()}
        self.limits, self.on_over, self.interval_s = limits, on_over, interval_s
        self.notices: list[str] = []
        """What was over a limit and what was removed, for the command's output."""
        self.allowed = {}
        self.before: dict[str, set[tuple[int, int]]] = {}
        """The entries each directory held when the command started."""
        for label, d in self.dirs.items():  # one walk: what a prune removes may stay in before, it is gone anyway
            self.before[label] = set()
            now = self._prune(label, usage(d, self.before[label]))
            self.allowed[label] = (max(limits.disk_mb * MIB, now.bytes), max(limits.files, now.entries))
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="disk-watch", daemon=True)

    def __enter__(self) -> DiskWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()
        killed = bool(self.notices) and self.notices[0].startswith("the command was killed")
        for label, d in self.dirs.items():
            now = self._prune(label, usage(d))
            if not (over := self._over(label, now)):
                continue
            # A command shorter than one poll ends before the watch looks: say so at its end instead.
            if not killed:
                self.notices.insert(0, f"the command ended over a limit: {over}")
                killed = True
            if n := remove_new(d, self.before[label]):
                self.notices.append(f"{label} was over a limit: the {n} files or folders the command created there "
                                    f"were removed; what was there before it stays")

    def _poll(self) -> None:
        wait = self.interval_s
        while not self._done.wait(wait):
            started = time.monotonic()
            for label, d in self.dirs.items():
                if over := self._over(label, usage(d)):
                    self.notices.insert(0, f"the command was killed: {over}")
                    self.on_over()
                    return
            wait = max(self.interval_s, 5 * (time.monotonic() - started))  # a huge tree is polled less often

    def _over(self, label: str, now: Usage) -> str | None:
        max_bytes, max_entries = self.allowed[label]
        if now.too_deep:
            return f"{label} holds a directory tree deeper than {MAX_DEPTH} levels"
        if now.bytes > max_bytes:
            return f"{label} held {now.bytes // MIB} MiB, over the sandbox's {self.limits.disk_mb} MiB limit"
        if now.entries > max_entries:
            return f"{label} held {now.entries} files, over the sandbox's {self.limits.files} limit"
        return None

    def _prune(self, label: str, now: Usage) -> Usage:
        if not now.too_deep:
            return now
        for name in now.too_deep:  # GNU rm walks any depth
            subprocess.run(["rm", "-rf", "--", name], cwd=self.dirs[label], capture_output=True, timeout=600)
        self.notices.append(f"removed {', '.join(now.too_deep)} from {label}: deeper than {MAX_DEPTH} levels "
                            f"(or unreadable)")
        return usage(self.dirs[label])
