"""Why a results database cannot be made or opened, said in one line with the fix (read-only mounts,
permissions, another process's lock, a file that is not a database)."""

from __future__ import annotations

import os
from pathlib import Path

from mkb.errors import StoreError

WRITABLE_FIX = "Point --db (or MKB_HOME, which holds all mutable state) at a writable directory."


def make_parent(path: Path) -> None:
    """Create the database's directory if needed.

    Raises:
        StoreError: it cannot be created (read-only file system, permissions).
    """
    if str(path) == ":memory:" or path.parent.is_dir():
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create the directory {path.parent} for the results database "
                         f"({exc.strerror or exc}). {WRITABLE_FIX}") from None


def explain(path: Path, read_only: bool, exc: Exception) -> str:
    """The one-line message for a DuckDB error met while opening path."""
    text = str(exc)
    if path.is_dir():
        return f"{path} is a directory. Point --db at a database file, e.g. {path / 'mkb.duckdb'}."
    if "lock" in text.lower():
        return f"{path} is in use by another mkb process. Wait for it to finish, or use another database with --db."
    if "Read-only file system" in text or "Permission denied" in text or not _writable(path, read_only):
        reason = "read-only file system" if "Read-only" in text or _on_read_only_mount(path) else "permission denied"
        if read_only:
            return f"{path} cannot be read ({reason}). Make it readable, or point --db at a copy."
        if not path.exists():
            return f"cannot create the results database {path} ({reason}). {WRITABLE_FIX}"
        return (f"{path} cannot be opened for writing ({reason}), and this command records results. Copy it to a "
                f"writable place and pass --db, or make it writable; commands that only read it (report, show, "
                f"export, db query) work on it as it is.")
    return (f"{path} is not a readable mkb database ({text.splitlines()[0][:160]}). "
            f"Move it aside and run 'mkb db init', or point --db elsewhere.")


def _writable(path: Path, read_only: bool) -> bool:
    """Writes need the file and its directory (DuckDB keeps a write-ahead log beside the file)."""
    paths = (path.parent, path) if path.exists() else (path.parent,)
    return read_only or all(os.access(p, os.W_OK) for p in paths)


def _on_read_only_mount(path: Path) -> bool:
    try:
        return bool(os.statvfs(path if path.exists() else path.parent).f_flag & os.ST_RDONLY)
    except OSError:
        return False
