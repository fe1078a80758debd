"""Runs whose process was killed (kill -9) end `interrupted` when the next mkb opens the database.

Real processes throughout: a live and a dead child for the owner check, and a real `mkb attempt` /
`mkb run-model` killed with SIGKILL while it waits on the scripted OpenAI-compatible server.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from scripted_server import Hold, call, reply

from mkb.records import Arm, State
from mkb.store import Attempt, Run, Store, Trial, now
from mkb.store.owner import Owner, current_owner, is_alive, process_start

HERE = socket.gethostname()
KERNEL = "import torch\n\ndef solve(x, residual, weight):\n    return x\n"


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_live_process_is_its_owner_and_a_dead_or_reused_pid_is_not():
    child = _sleeper()
    try:
        live = Owner(HERE, child.pid, process_start(child.pid))
        assert is_alive(live) and is_alive(current_owner())
    finally:
        child.kill()
        child.wait()
    assert not is_alive(live)
    me = current_owner()
    if me.start is None:
        pytest.skip("no /proc here: only the pid can be checked")
    boot, ticks = me.start.split("/")
    assert not is_alive(Owner(HERE, me.pid, f"{boot}/{int(ticks) + 1}"))  # our pid, another process's start
    assert not is_alive(Owner(HERE, me.pid, f"another-boot/{ticks}"))     # the machine rebooted since
    assert not is_alive(Owner("another-host", me.pid, me.start))         # not checkable: the write lock decides


def test_a_zombie_is_gone():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while process_start(child.pid) is not None and time.monotonic() < deadline:
        time.sleep(0.05)  # exited but not waited for: a zombie
    assert process_start(child.pid) is None
    child.wait()


def _rows(store: Store, run_id: str, owner: Owner | None, trial_id: str) -> None:
    o = owner or Owner(None, None, None)
    store.put(Run(run_id=run_id, model="m", host=o.host, owner_pid=o.pid, owner_start=o.start, started_at=now()),
              Attempt(attempt_id=f"a-{run_id}", model="m", trial_id=trial_id, run_id=run_id, state=State.RUNNING,
                      started_at=now()),
              Trial(model="m", trial_id=trial_id, run_id=run_id, attempt_id=f"a-{run_id}", problem_id="p28",
                    replicate=1, arm=Arm.SOLO_CUTEDSL, dsl="cutedsl", state=State.RUNNING, started_at=now()))


def test_opening_for_writing_marks_the_rows_of_gone_owners_interrupted(tmp_path):
    path = tmp_path / "mkb.duckdb"
    dead = _sleeper()
    dead.kill()
    dead.wait()
    owners = {"live": current_owner(), "dead": Owner(HERE, dead.pid, None), "elsewhere": Owner("h2", 1, None),
              "unrecorded": None}
    with Store(path) as store:
        for n, (name, owner) in enumerate(owners.items()):
            _rows(store, name, owner, f"p28_r{n + 1}_solo_cutedsl")
        store.put(Run(run_id="done", model="m", state=State.FINISHED, started_at=now()),
                  Attempt(attempt_id="stuck", model="m", trial_id="p28_r9_solo_cutedsl", run_id="done",
                          state=State.RUNNING, message="left behind", started_at=now()))
    with Store(path, read_only=True) as store:  # a reader changes nothing
        assert {r["state"] for r in store.rows("SELECT state FROM runs WHERE run_id <> 'done'")} == {"running"}
    with Store(path) as store:
        runs = {r["run_id"]: r["state"] for r in store.rows("SELECT run_id, state FROM runs")}
        attempts = {r["run_id"]: r for r in store.rows("SELECT run_id, state, message FROM attempts")}
        trials = {r["run_id"]: r["state"] for r in store.rows("SELECT run_id, state FROM trials")}
    assert runs == {"live": "running", "dead": "interrupted", "elsewhere": "interrupted",
                    "unrecorded": "interrupted", "done": "finished"}
    assert trials == {k: "running" if k == "live" else "interrupted" for k in owners}
    assert {k: a["state"] for k, a in attempts.items()} == {**trials, "done": "interrupted"}
    assert attempts["done"]["message"].startswith("left behind; interrupted: its run's process ended")
    assert attempts["live"]["message"] is None


def _mkb(db: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "mkb", "--db", str(db), *args]


def _kill_while_waiting_on_the_model(llm_server, argv: list[str]) -> None:
    """Start argv, let it reach its first model request (held), then SIGKILL its whole process group."""
    hold = Hold(reply("too late"), timeout_s=300)
    llm_server.script([hold])
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        assert hold.reached.wait(240), proc.stderr.read().decode() if proc.poll() is not None else "no request"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        proc.stderr.close()
        hold.release()


@pytest.mark.parametrize("command", ["attempt", "run-model"])
def test_a_killed_run_is_interrupted_when_the_next_one_opens_the_database(command, llm_server, tmp_path):
    db = tmp_path / "killed.duckdb"
    endpoint = ["--base-url", llm_server.base_url, "--device", "cpu"]
    args = (["attempt", "p28", "--dsl", "cutedsl", "--model", "scripted", *endpoint] if command == "attempt" else
            ["run-model", "scripted", "--problems", "p28", "--arms", "solo_cutedsl", "--concurrency", "1", *endpoint])
    _kill_while_waiting_on_the_model(llm_server, _mkb(db, *args))
    with Store(db, read_only=True) as store:  # what kill -9 leaves
        assert [r["state"] for r in store.rows("SELECT state FROM attempts")] == ["running"]

    llm_server.script([reply(calls=[call("write_file", {"path": "kernel.py", "content": KERNEL})]),
                       reply(calls=[call("finish", {})]), reply(calls=[call("finish", {})])])  # finish, confirmed
    second = subprocess.run(_mkb(db, *args), capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr
    assert "marked interrupted" in " ".join(second.stderr.split())
    with Store(db, read_only=True) as store:
        runs = store.rows("SELECT state, owner_pid FROM runs ORDER BY started_at")
        attempts = store.rows("SELECT state, message FROM attempts ORDER BY started_at")
        trial = store.rows("SELECT state, attempt_id FROM trials")
    assert [r["state"] for r in runs] == ["interrupted", "finished"]
    assert all(r["owner_pid"] for r in runs)
    assert [a["state"] for a in attempts] == ["interrupted", "finished"]
    assert "its run's process ended without recording how it ended" in attempts[0]["message"]
    assert [t["state"] for t in trial] == ["finished"]
