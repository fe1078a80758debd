"""Conformance suite for the workspace executors: the same checks against every backend.

Backends: bwrap (the local executor isolated by bubblewrap), subprocess (its loud fallback) and docker
(a container from a small local image). KNOWN_DIFFERENCES lists, per backend, the checks it is known
to fail and why; each such check is skipped there with that reason.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from mkb.agent.executor import LocalExecutor, bwrap_problem

REPO = Path(__file__).resolve().parent.parent

KNOWN_DIFFERENCES: dict[str, dict[str, str]] = {
    "bwrap": {},
    "subprocess": {
        "network": "the fallback has no network namespace",
        "hidden_host": "the fallback sees the host's files and processes",
        "workdir": "the fallback runs in the workspace's host path, not /workspace",
        "read_only_system": "the fallback can write wherever the user can",
    },
    "docker": {
        "toolchain": "the test image is a bare Debian base; the mkb image carries Python and the DSLs",
        "read_only_system": "the container's own filesystem is writable (its copy-on-write layer, not the host's)",
    },
}


SECRET = "sk-test-secret-value"


@pytest.fixture(params=["bwrap", "subprocess", "docker"])
def backend(request, tmp_path, monkeypatch):
    """(name, executor) over a fresh workspace holding kernel.py and SKILL.md; the host has secrets set."""
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("MKB_SECRET_TOKEN", SECRET)
    workspace = tmp_path / "attempt" / "workspace"
    workspace.mkdir(parents=True)
    (workspace / "kernel.py").write_text("def solve(x):\n    return x\n")
    (workspace / "SKILL.md").write_text("")
    (tmp_path / "other-attempt").mkdir()
    (tmp_path / "other-attempt" / "kernel.py").write_text("SECRET_OTHER_ATTEMPT\n")
    name = request.param
    if name == "bwrap":
        if bwrap_problem():
            pytest.skip(f"bubblewrap cannot run here: {bwrap_problem()}")
        executor = LocalExecutor(workspace, hide=(REPO,))
    elif name == "subprocess":
        executor = LocalExecutor(workspace, isolate=False)
    else:
        from conftest import TEST_IMAGE

        from mkb.agent.docker_executor import DockerExecutor

        executor = DockerExecutor(workspace, TEST_IMAGE, cpus=1, memory="512m", pids=256,
                                  client=request.getfixturevalue("docker_engine"))
    yield name, executor
    executor.close()


def expect(name: str, check: str) -> None:
    if check in KNOWN_DIFFERENCES[name]:
        pytest.skip(f"known difference of {name}: {KNOWN_DIFFERENCES[name][check]}")


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


def test_host_secrets_and_other_attempts_are_hidden(backend, tmp_path, mkb_home):
    name, ex = backend
    expect(name, "hidden_host")
    mkb_home.mkdir(parents=True, exist_ok=True)
    (mkb_home / "mkb.duckdb").write_text("results")
    probe = (f"cat {tmp_path}/other-attempt/kernel.py {REPO}/mkb/store.py {mkb_home}/mkb.duckdb 2>/dev/null | wc -c; "
             f"ls {REPO}/problems/solutions 2>/dev/null | wc -l; "
             f"cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c {SECRET}; "
             f"test -e /var/run/docker.sock && echo docker-socket || echo no-socket")
    assert ex.exec(probe, timeout_s=30).output.split() == ["0", "0", "0", "no-socket"]


def test_toolchain_runs_in_the_sandbox(backend):
    name, ex = backend
    expect(name, "toolchain")
    result = ex.exec("python -c 'from importlib.metadata import version; print(\"TORCH\", version(\"torch\"))'; "
                     "python -c 'import mkb' 2>&1 | tail -1", timeout_s=60)
    assert "TORCH 2." in result.output
    if name == "bwrap":  # the grader's code is not importable from inside
        assert "No module named 'mkb'" in result.output


def test_system_directories_are_read_only_and_cannot_be_remounted(backend):
    name, ex = backend
    expect(name, "read_only_system")
    out = ex.exec("touch /usr/mkb-probe 2>&1; mount -o remount,rw /usr 2>&1; touch /usr/mkb-probe 2>&1 || echo DENIED",
                  timeout_s=30).output
    assert "DENIED" in out and not Path("/usr/mkb-probe").exists()
