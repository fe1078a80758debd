"""Conformance suite for the workspace executors: the same checks against every backend.

Backends: bwrap (the local executor isolated by bubblewrap, in a cgroup where one can be made),
bwrap-rlimits (the same with per-process limits only, as where no cgroup can be made), subprocess (the unisolated local executor,
allowed only with MKB_UNSAFE_SANDBOX) and docker (a container from a small local image). Every backend
runs under the same LIMITS. KNOWN_DIFFERENCES lists, per backend, the checks it is known to fail and why;
each such check is skipped there with that reason. A limit the host gives no means to enforce (a local
backend without a writable cgroup) is skipped with the executor's own account of it.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

import sys
import uuid

from mkb.agent.executor import LocalExecutor, bwrap_problem
from mkb.agent.limits import SandboxLimits

REPO = Path(__file__).resolve().parent.parent
LIMITS = SandboxLimits(memory_mb=512, pids=256, cpus=1, disk_mb=256, files=2000, shm_mb=64)

KNOWN_DIFFERENCES: dict[str, dict[str, str]] = {
    "bwrap": {},
    "bwrap-rlimits": {},
    "subprocess": {
        "network": "the unisolated executor has no network namespace",
        "hidden_host": "the unisolated executor has no mount namespace: it sees the host's files, processes "
                       "and /dev/shm",
        "workdir": "the unisolated executor runs in the workspace's host path, not /workspace",
        "read_only_system": "the unisolated executor can write wherever the user can",
    },
    "docker": {
        "toolchain": "the test image is a bare Debian base; the mkb image carries Python and the DSLs",
    },
}


SECRET = "sk-test-secret-value"


@pytest.fixture
def runner_state(tmp_path, monkeypatch):
    """The runner's private state where a sandbox could see it: MKB_HOME and the database inside the
    toolchain directory (which bubblewrap shows), where that is writable; else under tmp_path."""
    visible = Path(sys.prefix).resolve()
    base = visible if os.access(visible, os.W_OK) else tmp_path
    home, db = base / f"mkb-test-home-{uuid.uuid4().hex[:8]}", base / f"mkb-test-{uuid.uuid4().hex[:8]}.duckdb"
    home.mkdir()
    (home / "mkb.duckdb").write_text("RESULTS-IN-HOME")
    db.write_text("RESULTS-DB")
    monkeypatch.setenv("MKB_HOME", str(home))
    monkeypatch.setenv("MKB_DB", str(db))
    yield home, db
    (home / "mkb.duckdb").unlink()
    home.rmdir()
    db.unlink()


@pytest.fixture(params=["bwrap", "bwrap-rlimits", "subprocess", "docker"])
def backend(request, tmp_path, monkeypatch, runner_state):
    """(name, executor) over a fresh workspace holding kernel.py and SKILL.md, under LIMITS; the host has
    secrets set and the runner's state placed where a sandbox could see it."""
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("MKB_SECRET_TOKEN", SECRET)
    workspace = tmp_path / "attempt" / "workspace"
    workspace.mkdir(parents=True)
    (workspace / "kernel.py").write_text("def solve(x):\n    return x\n")
    (workspace / "SKILL.md").write_text("")
    (tmp_path / "other-attempt").mkdir()
    (tmp_path / "other-attempt" / "kernel.py").write_text("SECRET_OTHER_ATTEMPT\n")
    name = request.param
    if name.startswith("bwrap"):
        if bwrap_problem():
            pytest.skip(f"bubblewrap cannot run here: {bwrap_problem()}")
        executor = LocalExecutor(workspace, hide=(REPO,), limits=LIMITS, cgroup=name == "bwrap")
    elif name == "subprocess":
        executor = LocalExecutor(workspace, isolate=False, allow_unsafe=True, limits=LIMITS)
    else:
        from conftest import TEST_IMAGE

        from mkb.agent.docker_executor import DockerExecutor

        executor = DockerExecutor(workspace, TEST_IMAGE, limits=LIMITS, client=request.getfixturevalue("docker_engine"))
    yield name, executor
    executor.close()


def expect(name: str, check: str) -> None:
    if check in KNOWN_DIFFERENCES[name]:
        pytest.skip(f"known difference of {name}: {KNOWN_DIFFERENCES[name][check]}")


def enforced(ex, limit: str) -> None:
    """Skip when the executor says this host gives it no means to enforce the limit (its words)."""
    if "not capped" in ex.limits[limit] or "not tracked" in ex.limits[limit]:
        pytest.skip(f"{limit} is not enforced here: {ex.limits[limit]}")


def test_runs_bash_in_the_workspace(backend):
    name, ex = backend
    result = ex.exec("pwd; cat kernel.py; echo to-stderr >&2; exit 3", timeout_s=30)
    assert result.exit_code == 3 and not result.timed_out
    assert "def solve" in result.output and "to-stderr" in result.output
    assert result.output.splitlines()[0] == ex.workdir


def test_workdir_is_workspace_mount(backend):
    name, ex = backend
    expect(name, "workdir")
    assert ex.workdir == "/workspace"


def test_files_round_trip_between_tools_and_commands(backend):
    _, ex = backend
    ex.write_file("sub/dir/notes.txt", "héllo\n")
    assert ex.exec("cat sub/dir/notes.txt", timeout_s=30).output == "héllo\n"
    ex.exec("printf made-by-bash > made.txt", timeout_s=30)
    assert ex.read_file("made.txt") == "made-by-bash"
    assert ex.read_file(f"{ex.workdir}/made.txt") == "made-by-bash"
    ex.write_file("kernel.py", "replaced\n")
    assert ex.read_file("./kernel.py") == "replaced\n"


def test_file_errors_are_precise(backend):
    _, ex = backend
    ex.exec("mkdir -p adir && ln -s /etc/passwd escape", timeout_s=30)
    with pytest.raises(FileNotFoundError):
        ex.read_file("missing.txt")
    with pytest.raises(IsADirectoryError):
        ex.read_file("adir")
    with pytest.raises(IsADirectoryError):
        ex.write_file("adir", "x")
    for outside in ("../other-attempt/kernel.py", "/etc/passwd", "escape"):
        with pytest.raises(PermissionError):
            ex.read_file(outside)
    with pytest.raises(PermissionError):
        ex.write_file("../evil.txt", "x")


def test_a_command_that_runs_forever_is_cut_off(backend):
    _, ex = backend
    started = time.monotonic()
    result = ex.exec("echo started; while true; do sleep 0.05; done", timeout_s=0.5)
    assert result.timed_out and result.exit_code is None
    assert "started" in result.output
    assert time.monotonic() - started < 8


def _host_processes_with(token: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if token in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode():
                found.append(int(pid))
        except OSError:
            pass
    return found


def _gone(token: str, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while _host_processes_with(token):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_timeout_kills_everything_the_command_started(backend):
    _, ex = backend
    result = ex.exec("sleep 312.25 & sleep 312.5 & sleep 312.75", timeout_s=0.5)
    assert result.timed_out
    assert _gone("312.")


def test_background_jobs_end_with_their_command(backend):
    _, ex = backend
    started = time.monotonic()
    result = ex.exec("sleep 313.25 & echo launched", timeout_s=20)
    assert result.exit_code == 0 and "launched" in result.output and not result.timed_out
    assert time.monotonic() - started < 10
    assert _gone("313.25")


def test_output_is_capped_keeping_head_and_tail(backend):
    _, ex = backend
    result = ex.exec("echo BEGIN; head -c 300000 /dev/zero | tr '\\0' a; echo; echo END", timeout_s=30,
                     output_limit=1000)
    assert result.output.startswith("BEGIN") and result.output.rstrip().endswith("END")
    assert len(result.output) < 1200 and "bytes of output omitted" in result.output
    assert result.omitted_bytes > 298_000


def test_environment_is_allow_listed(backend):
    _, ex = backend
    output = ex.exec("env", timeout_s=30).output
    env = dict(line.split("=", 1) for line in output.splitlines() if "=" in line)
    assert SECRET not in output and "OPENAI_API_KEY" not in env and "MKB_SECRET_TOKEN" not in env
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["HOME"] and "MKB_HOME" not in env


def test_no_gpu_devices(backend):
    _, ex = backend
    result = ex.exec("ls /dev | grep -c nvidia || true", timeout_s=30)
    assert result.output.strip() == "0"


def test_no_network(backend):
    name, ex = backend
    expect(name, "network")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0)
    port = listener.getsockname()[1]
    try:
        result = ex.exec(f"(exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo CONNECTED || echo REFUSED",
                         timeout_s=30)
        assert "REFUSED" in result.output
        with pytest.raises(BlockingIOError):
            listener.accept()
        interfaces = ex.exec("cat /proc/net/dev", timeout_s=30).output
        assert [line.split(":")[0].strip() for line in interfaces.splitlines()[2:]] == ["lo"]
    finally:
        listener.close()


def test_host_secrets_and_other_attempts_are_hidden(backend, tmp_path, runner_state):
    name, ex = backend
    expect(name, "hidden_host")
    home, db = runner_state
    probe = (f"cat {tmp_path}/other-attempt/kernel.py {REPO}/mkb/store.py {home}/mkb.duckdb {db} 2>/dev/null | wc -c; "
             f"ls {REPO}/problems/solutions {REPO}/artifact/results 2>/dev/null | wc -l; "
             f"cat /proc/[0-9]*/environ /proc/$PPID/environ 2>/dev/null | tr '\\0' '\\n' | grep -c {SECRET}; "
             f"test -e /var/run/docker.sock && echo docker-socket || echo no-socket")
    assert ex.exec(probe, timeout_s=30).output.split() == ["0", "0", "0", "no-socket"]


def test_toolchain_runs_in_the_sandbox(backend):
    name, ex = backend
    expect(name, "toolchain")
    result = ex.exec("python -c 'from importlib.metadata import version; print(\"TORCH\", version(\"torch\"))'; "
                     "python -c 'import mkb' 2>&1 | tail -1", timeout_s=60)
    assert "TORCH 2." in result.output
    if name.startswith("bwrap"):  # the grader's code is not importable from inside
        assert "No module named 'mkb'" in result.output


def test_nothing_but_the_workspace_and_tmp_takes_unbounded_writes(backend):
    name, ex = backend
    expect(name, "read_only_system")
    probe = ("for d in / /dev /usr /etc /opt /var /home /run /srv /mnt; do [ -d $d ] || continue; "
             "if touch $d/mkb-probe 2>/dev/null; then echo $d $(df -k --output=size $d | tail -1); fi; done")
    writable = [line.split() for line in ex.exec(probe, timeout_s=30).output.splitlines()]
    assert all(int(size_kib) <= max(LIMITS.shm_mb, 64) * 1024 for _, size_kib in writable), writable


def test_system_directories_are_read_only_and_cannot_be_remounted(backend):
    name, ex = backend
    expect(name, "read_only_system")
    out = ex.exec("touch /usr/mkb-probe 2>&1; mount -o remount,rw /usr 2>&1; touch /usr/mkb-probe 2>&1 || echo DENIED",
                  timeout_s=30).output
    assert "DENIED" in out and not Path("/usr/mkb-probe").exists()


# -- what an attempt's commands may use (the same LIMITS for every backend) ---------------------------------


def test_processes_that_leave_the_session_end_with_their_command(backend):
    _, ex = backend
    enforced(ex, "strays")
    result = ex.exec("setsid sleep 314.25 & nohup setsid sleep 314.5 > /dev/null 2>&1 & "
                     "(setsid bash -c 'sleep 314.75 & disown' &); sleep 0.2; echo launched", timeout_s=20)
    assert result.exit_code == 0 and "launched" in result.output
    assert _gone("314.")


def test_memory_is_capped(backend):
    _, ex = backend
    # tail keeps the whole (newline-free) stream in memory: 900 MiB against the 512 MiB limit
    result = ex.exec("head -c 900m /dev/zero | tail > /dev/null; echo rc=$?", timeout_s=60)
    assert "rc=0" not in result.output and "rc=" in result.output
    if "(cgroup v" in ex.limits["memory"]:  # the local executor names the limit that killed the process
        assert "memory limit" in result.output


def test_process_count_is_capped(backend):
    _, ex = backend
    enforced(ex, "pids")
    fork = ("perl -e 'my $n = 0; for (1 .. 400) { my $p = fork; last unless defined $p; "
            "if (!$p) { sleep 30; exit } $n++ } print \"forked $n\\n\"'")
    result = ex.exec(fork, timeout_s=60)
    forked = int(result.output.split("forked ")[1].split()[0])
    assert 50 < forked < LIMITS.pids


def test_a_file_cannot_exceed_the_disk_limit(backend):
    _, ex = backend
    result = ex.exec("head -c 400m /dev/zero > big; echo rc=$?", timeout_s=60)
    assert "rc=0" not in result.output  # the write fails (or the disk watchdog stops the command)
    size = ex.exec("stat -c %s big 2>/dev/null || echo 0", timeout_s=30).output
    assert int(size) <= LIMITS.disk_mb << 20


def _held(ex, folder: str) -> tuple[int, int]:
    """(KiB used, entries) under folder; (0, 0) when it is gone."""
    out = ex.exec(f"kib=$(du -sk {folder} 2>/dev/null | cut -f1); echo ${{kib:-0}} $(find {folder} 2>/dev/null | wc -l)",
                  timeout_s=30).output
    kib, entries = out.split()
    return int(kib), int(entries)


@pytest.mark.parametrize("where", ["the workspace", "tmp"])
def test_the_workspace_and_tmp_cannot_grow_past_the_disk_limit(backend, where):
    name, ex = backend
    folder = "." if where == "the workspace" else "$TMPDIR/fill"  # TMPDIR: /tmp, or the unisolated executor's own
    ex.exec(f"mkdir -p {folder} && echo before > {folder}/kept", timeout_s=30)
    fill = (f"i=0; while head -c 50m /dev/zero > {folder}/f$i; do i=$((i+1)); "
            f"[ $i -gt 40 ] && break; done; echo stopped at $i")
    result = ex.exec(fill, timeout_s=60)
    assert not result.timed_out and "stopped at 41" not in result.output
    # docker: a size-capped mount refuses the write; locally the watch says what it removed, however fast
    assert name == "docker" or "were removed; what was there before it stays" in result.output
    assert _held(ex, folder)[0] <= LIMITS.disk_mb * 1024  # what it wrote is gone, at its end
    assert ex.exec(f"cat {folder}/kept", timeout_s=30).output.strip() == "before"
    small = ex.exec(f"rm -f {folder}/f*; head -c 1m /dev/zero > {folder}/small; echo rc=$?", timeout_s=30)
    assert small.output.strip().endswith("rc=0") and small.exit_code == 0


@pytest.mark.parametrize("where", ["the workspace", "tmp"])
def test_the_workspace_and_tmp_cannot_hold_more_files_than_the_limit(backend, where):
    """However fast a command makes files (6000 take ~0.1 s, less than one poll), none stays past the limit."""
    name, ex = backend
    folder = "." if where == "the workspace" else "$TMPDIR/many"
    ex.exec(f"mkdir -p {folder}/m && echo before > {folder}/m/kept", timeout_s=30)
    result = ex.exec(f"cd {folder}/m && for i in $(seq 6000); do : > f$i || break; done; ls | wc -l",
                     timeout_s=120)
    assert not result.timed_out
    assert name == "docker" or "files, over the sandbox's 2000 limit" in result.output
    assert _held(ex, f"{folder}/m")[1] <= LIMITS.files
    assert ex.exec(f"cat {folder}/m/kept", timeout_s=30).output.strip() == "before"
    again = ex.exec(f"cd {folder}/m && rm -f f* && for i in $(seq 100); do : > g$i; done && ls | wc -l",
                    timeout_s=60)
    assert again.output.strip() == "101"  # the directory is usable again


def test_dev_shm_is_capped(backend):
    name, ex = backend
    expect(name, "hidden_host")
    size_kib = int(ex.exec("df -k /dev/shm | tail -1 | awk '{print $2}'", timeout_s=30).output.split()[0])
    assert size_kib <= LIMITS.shm_mb * 1024


@pytest.mark.timing
def test_cpu_time_is_capped(backend):
    _, ex = backend
    enforced(ex, "cpus")
    busy = "timeout 2 sh -c 'while :; do :; done'"
    result = ex.exec(f"{busy} & {busy} & {busy} & wait; times", timeout_s=30)
    user, system = result.output.split()[-2:]  # the children's user and system time, e.g. 1m2.003s
    seconds = sum(float(t.split("m")[0]) * 60 + float(t.split("m")[1].rstrip("s")) for t in (user, system))
    assert seconds < 2 * LIMITS.cpus * 1.25


def test_a_tree_too_deep_to_walk_is_removed_not_hidden_in(backend):
    name, ex = backend
    deep = "d/" * 80
    result = ex.exec(f"mkdir -p {deep} && head -c 100m /dev/zero > {deep}f; chmod 000 d; echo made", timeout_s=60)
    assert "made" in result.output or "killed" in result.output
    if name == "docker":  # tmpfs volumes count every byte at any depth: nothing to remove
        assert "d" in ex.exec("ls", timeout_s=30).output.split()
        return
    assert "deeper than 64 levels" in result.output
    assert "d" not in ex.exec("ls", timeout_s=30).output.split()


def test_strays_end_even_when_the_command_kills_what_runs_it(backend):
    name, ex = backend
    expect(name, "hidden_host")  # unisolated, $PPID is the runner itself
    enforced(ex, "strays")
    result = ex.exec("setsid sleep 315.25 & sleep 0.2; kill -9 $PPID 2>/dev/null; echo done", timeout_s=20)
    assert not result.timed_out
    assert _gone("315.25")
