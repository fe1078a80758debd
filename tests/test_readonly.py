"""Read-only paths give one-line errors that name the path and the fix; nothing is lost.

The directory is made read-only by a real read-only bind mount (bubblewrap's --ro-bind, which works for
root too, unlike chmod); mkb runs inside that mount namespace as a real subprocess.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ARTIFACT_DB = Path(__file__).resolve().parent.parent / "artifact" / "results" / "mkb-h200.duckdb"


def _ro_prefix(ro: Path) -> list[str]:
    return ["bwrap", "--bind", "/", "/", "--ro-bind", str(ro), str(ro), "--dev", "/dev", "--proc", "/proc", "--"]


@pytest.fixture(scope="module")
def ro(tmp_path_factory) -> Path:
    """A directory that is read-only inside _ro_prefix's mount namespace; it holds a valid database (shared by
    the tests: none of them may change it)."""
    ro = tmp_path_factory.mktemp("ro")
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (apt-get install bubblewrap): no read-only bind mount")
    probe = subprocess.run([*_ro_prefix(ro), "touch", str(ro / "probe")], capture_output=True, text=True)
    if probe.returncode == 0 or "Read-only" not in probe.stderr:
        pytest.skip(f"bubblewrap cannot make a read-only bind mount here: {probe.stderr.strip()[:200]}")
    made = subprocess.run([sys.executable, "-m", "mkb", "db", "init", "--db", str(ro / "x.duckdb")],
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    shutil.copy(ARTIFACT_DB, ro / "shipped.duckdb")
    return ro


def _mkb(ro: Path, *args: str, home: Path | None = None, db: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "MKB_UNSAFE_SANDBOX": "1"}
    if home is not None:
        env["MKB_HOME"] = str(home)
    if db is not None:
        env["MKB_DB"] = str(db)
    return subprocess.run([*_ro_prefix(ro), sys.executable, "-m", "mkb", *args], capture_output=True, text=True,
                          env=env, timeout=300)


def _one_line_error(result: subprocess.CompletedProcess, *words: str) -> str:
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    line = " ".join(result.stderr.split())
    assert line.startswith("Error: ") and all(w in line for w in words), line
    return line


def _digests(ro: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(ro.iterdir())}


def test_db_init_in_a_new_directory_on_a_read_only_mount(ro):
    line = _one_line_error(_mkb(ro, "--db", str(ro / "newdir" / "x.duckdb"), "db", "init"),
                           f"cannot create the directory {ro / 'newdir'}", "Read-only file system", "--db")
    assert "MKB_HOME" in line


def test_mkb_home_on_a_read_only_mount(ro, tmp_path):
    _one_line_error(_mkb(ro, "db", "init", home=ro), f"cannot create the results database {ro / 'mkb.duckdb'}",
                    "read-only file system", "writable")
    _one_line_error(_mkb(ro, "db", "init", home=ro / "sub"), f"cannot create the directory {ro / 'sub'}")
    attempt = _mkb(ro, "attempt", "p28", "--dsl", "cutedsl", "--model", "vllm/x", "--device", "cpu", "--sandbox",
                   "none", "--db", str(tmp_path / "w.duckdb"), home=ro)
    _one_line_error(attempt, f"{ro} is not writable", "workspace", "MKB_HOME")
    run = _mkb(ro, "run-model", "reference", "--problems", "p28", "--device", "cpu", "--db",
               str(tmp_path / "w.duckdb"), home=ro)
    _one_line_error(run, f"{ro} is not writable", "MKB_HOME")
    report = _mkb(ro, "report", "--db", str(ro / "shipped.duckdb"), "--no-figures", home=ro)
    _one_line_error(report, f"{ro / 'report'} is not writable", "--out")
    assert not (tmp_path / "w.duckdb").exists()  # refused before anything was made
    reads = _mkb(ro, "db", "query", "SELECT count(*) AS n FROM trials", "--json", home=ro, db=ro / "shipped.duckdb")
    assert reads.returncode == 0 and '"n": 48' in reads.stdout, reads.stderr  # reading needs no writable home


def test_an_existing_database_on_a_read_only_mount_is_read_but_never_written(ro, tmp_path):
    before = _digests(ro)
    db = str(ro / "x.duckdb")
    for args in (["attempt", "p28", "--dsl", "cutedsl", "--model", "vllm/x", "--device", "cpu", "--sandbox", "none"],
                 ["run-model", "reference", "--problems", "p28", "--device", "cpu"], ["db", "init"]):
        line = _one_line_error(_mkb(ro, *args, "--db", db, home=tmp_path / "home"),
                               f"{db} cannot be opened for writing (read-only file system)", "Copy it", "--db")
        assert "not a readable mkb database" not in line and "Move it aside" not in line
    query = _mkb(ro, "db", "query", "SELECT count(*) AS n FROM problems", "--json", "--db", db)
    assert query.returncode == 0 and '"n": 74' in query.stdout, query.stderr
    export = _mkb(ro, "export", "--parquet", str(ro / "out"), "--db", db)
    _one_line_error(export, str(ro / "out"), "Read-only file system", "writable")
    assert _digests(ro) == before
