"""Which sandbox an attempt may run in: unisolated commands refused unless MKB_UNSAFE_SANDBOX says so, said in
one line before anything is stored; the Docker backend's limits fitted to the engine's host.

The refusal tests run the real `mkb` in a child process whose PATH has no bubblewrap (the check is cached per
process), against the scripted OpenAI-compatible server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from attempt_kit import FINISH
from scripted_server import call, reply

from mkb.agent.executor import LocalExecutor
from mkb.agent.limits import SandboxLimits
from mkb.agent.sandboxes import SandboxRefused
from mkb.cli import main
from mkb.store import Store

REFUSED = ("Error: the agent's commands cannot be isolated here: {problem}. Install bubblewrap (apt-get install "
           "bubblewrap), use --sandbox docker, or set MKB_UNSAFE_SANDBOX=1 to run them unisolated (they could then "
           "read your API key, the results database and the solutions).")


def _mkb(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """Run `python -m mkb` with a PATH that holds nothing (so no bwrap) and a fresh MKB_HOME."""
    empty = tmp_path / "empty-bin"
    empty.mkdir(exist_ok=True)
    base = {k: v for k, v in os.environ.items() if k not in ("MKB_UNSAFE_SANDBOX", "PATH")}
    return subprocess.run([sys.executable, "-m", "mkb", *args], capture_output=True, text=True, timeout=300,
                          env={**base, "PATH": str(empty), "MKB_HOME": str(tmp_path / "home"), **env})


def _attempt_args(llm_server, db: Path, *extra: str) -> list[str]:
    return ["--db", str(db), "attempt", "p28", "--dsl", "cutedsl", "--model", "openai/gpt-x", "--base-url",
            llm_server.base_url, "--device", "cpu", "--json", *extra]


def test_no_isolation_is_refused_unless_allowed(tmp_path):
    with pytest.raises(SandboxRefused, match="Install bubblewrap .* use --sandbox docker, or set MKB_UNSAFE_SANDBOX=1"):
        LocalExecutor(tmp_path / "ws", isolate=False)
    assert not (tmp_path / "ws.tmp").exists()
    executor = LocalExecutor(tmp_path / "ws", isolate=False, allow_unsafe=True)
    try:
        assert executor.isolation == "subprocess"
    finally:
        executor.close()


def test_attempt_without_bubblewrap_is_refused_in_one_line_and_stores_nothing(llm_server, tmp_path):
    db = tmp_path / "refused.duckdb"
    result = _mkb(_attempt_args(llm_server, db), tmp_path)
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines() == [REFUSED.format(problem="bwrap is not installed")]
    assert not db.exists() and llm_server.requests == []


def test_the_unsafe_setting_lets_an_attempt_run_unisolated(llm_server, tmp_path):
    llm_server.script([reply(calls=[call("bash", {"command": "echo $HOME"})]), *FINISH])
    db = tmp_path / "unsafe.duckdb"
    result = _mkb(_attempt_args(llm_server, db), tmp_path, MKB_UNSAFE_SANDBOX="1")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)[0]
    assert (summary["state"], summary["isolation"]) == ("finished", "subprocess")
    assert "NO SANDBOX (MKB_UNSAFE_SANDBOX is set): bwrap is not installed" in " ".join(result.stderr.split())
    with Store(db, read_only=True) as store:
        assert store.rows("SELECT sandbox FROM attempts")[0]["sandbox"] == "subprocess"
        system = store.messages(summary["attempt_id"])[0]
        limits = system.extra["limits"]
    assert set(limits) == {"memory", "pids", "cpus", "disk", "shm", "strays"}


def test_run_model_without_bubblewrap_stops_before_any_trial(llm_server, tmp_path):
    db = tmp_path / "run.duckdb"
    result = _mkb(["--db", str(db), "run-model", "openai/gpt-x", "--problems", "p28", "--arms", "solo_cutedsl",
                   "--device", "cpu", "--base-url", llm_server.base_url], tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == REFUSED.format(problem="bwrap is not installed")
    assert "Traceback" not in result.stderr and llm_server.requests == []
    with Store(db, read_only=True) as store:
        assert store.rows("SELECT count(*) AS n FROM trials")[0]["n"] == 0
        assert store.rows("SELECT count(*) AS n FROM attempts")[0]["n"] == 0


def test_sandbox_none_needs_the_unsafe_setting_too(llm_server, tmp_path, monkeypatch):
    monkeypatch.delenv("MKB_UNSAFE_SANDBOX", raising=False)
    result = CliRunner().invoke(main, _attempt_args(llm_server, tmp_path / "none.duckdb", "--sandbox", "none"))
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [REFUSED.format(problem="--sandbox none asks for no isolation")]


# -- the Docker backend on the engine's host ------------------------------------------------------------------


def test_docker_cpus_are_capped_to_the_engines(docker_engine, tmp_path):
    from conftest import TEST_IMAGE

    from mkb.agent.docker_executor import DockerExecutor

    ncpu = docker_engine.info()["NCPU"]
    (tmp_path / "ws").mkdir()
    executor = DockerExecutor(tmp_path / "ws", TEST_IMAGE, limits=SandboxLimits(cpus=ncpu + 62, memory_mb=256),
                              client=docker_engine)
    try:
        assert executor.container.attrs["HostConfig"]["NanoCpus"] == ncpu * 10 ** 9
        assert executor.limits["cpus"] == f"{ncpu} CPUs (capped from {ncpu + 62}: the host has {ncpu})"
        assert executor.exec("echo up", timeout_s=30).output == "up\n"
    finally:
        executor.close()


def test_a_container_the_engine_refuses_is_one_clear_error_and_leaves_nothing(docker_engine, tmp_path):
    from conftest import TEST_IMAGE

    from mkb.agent.docker_executor import DockerExecutor
    from mkb.errors import ConfigError

    def ours() -> set[str]:
        return {v.name for v in docker_engine.volumes.list(filters={"label": "mkb.role=attempt"})}

    before = ours()
    (tmp_path / "ws").mkdir()
    with pytest.raises(ConfigError, match=r"^the Docker engine refused the attempt's container: .*memory.*"
                                          r"Fix the engine, or use --sandbox local\.$"):
        DockerExecutor(tmp_path / "ws", TEST_IMAGE, limits=SandboxLimits(memory_mb=1), client=docker_engine)
    assert ours() == before


def test_mkb_attempt_in_docker_with_the_default_limits(docker_engine, llm_server, tmp_path):
    """The default limits (4 CPUs, 16 GiB) on whatever host this is: a 2-CPU engine refused cpus=4 before."""
    from conftest import TEST_IMAGE

    llm_server.script([reply(calls=[call("bash", {"command": "nproc; touch /usr/x 2>&1 | tail -1"})]), *FINISH])
    db = tmp_path / "docker.duckdb"
    result = CliRunner().invoke(main, _attempt_args(llm_server, db, "--sandbox", "docker", "--image", TEST_IMAGE))
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)[0]
    assert (summary["state"], summary["isolation"]) == ("finished", f"docker:{TEST_IMAGE}")
    bash = llm_server.requests[1]["messages"][-1]["content"]
    assert "Read-only file system" in bash


def test_run_model_with_a_missing_image_stops_before_any_trial(docker_engine, llm_server, tmp_path):
    db = tmp_path / "image.duckdb"
    result = CliRunner().invoke(main, ["--db", str(db), "run-model", "openai/gpt-x", "--problems", "p28", "--arms",
                                       "solo_cutedsl", "--device", "cpu", "--base-url", llm_server.base_url,
                                       "--sandbox", "docker", "--image", "mkb-test/no-such-image:0"])
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines()[-1] == ("Error: Docker image 'mkb-test/no-such-image:0' not found. "
                                                      "Build it (make image), or choose another with --image.")
    with Store(db, read_only=True) as store:
        assert store.rows("SELECT count(*) AS n FROM trials")[0]["n"] == 0
