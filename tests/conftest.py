"""Shared fixtures: isolated MKB_HOME per test, real DuckDB stores, GPU tests that skip themselves."""

from __future__ import annotations

import pytest


def pytest_addoption(parser):
    parser.addoption("--gpu-records", metavar="DIR",
                     help="GPU tests write what they measured (judge records, example timings) as JSON into DIR "
                          "(scripts/gpu_session.sh passes its $OUT).")


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none visible)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def gpu_records(request):
    """record(name, row): appends row to DIR/<name>.json (with the machine's facts) under --gpu-records DIR;
    without the option nothing is written."""
    import json
    from pathlib import Path

    out = request.config.getoption("--gpu-records")
    files: dict[str, dict] = {}

    def record(name: str, row: dict) -> None:
        if not out:
            return
        if name not in files:
            from mkb.environment import describe

            files[name] = {"environment": describe(with_gpu=True), "records": []}
        files[name]["records"].append(row)
        path = Path(out) / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(files[name], indent=1, default=str) + "\n")

    return record


@pytest.fixture(autouse=True)
def mkb_home(tmp_path, monkeypatch):
    """Every test gets its own MKB_HOME (database, workspaces, caches) under tmp_path, on a host without a dead
    run's judge or submission directories: `verify`, `attempt` and `run-model` sweep those first and say so on
    stderr, which a test reading a command's exact stderr would otherwise see (a run killed on this machine)."""
    from mkb.judge import leftovers

    leftovers.sweep()
    home = tmp_path / "mkb-home"
    monkeypatch.setenv("MKB_HOME", str(home))
    monkeypatch.delenv("MKB_DB", raising=False)
    return home


@pytest.fixture
def store(tmp_path):
    """A real DuckDB results file."""
    from mkb.store import Store

    with Store(tmp_path / "mkb.duckdb") as s:
        yield s


@pytest.fixture
def llm_server():
    """A real OpenAI-compatible server on a free port (tests/scripted_server.py): script replies, read requests."""
    import threading

    from scripted_server import ScriptedOpenAIServer

    server = ScriptedOpenAIServer(("127.0.0.1", 0))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


TEST_IMAGE = "local/debian:bookworm"
"""A small local image (scripts/dockerd.sh base-image) for Docker executor tests."""


@pytest.fixture(scope="session")
def docker_engine():
    """A Docker client with TEST_IMAGE present: starts dockerd via scripts/dockerd.sh when needed (and stops
    the one it started), or skips with the reason."""
    import os
    import shutil
    import subprocess
    from pathlib import Path

    docker = pytest.importorskip("docker")
    script = Path(__file__).resolve().parent.parent / "scripts" / "dockerd.sh"
    started = False
    try:
        docker.from_env().ping()
    except docker.errors.DockerException:
        if shutil.which("dockerd") is None:
            pytest.skip("no Docker engine answers and dockerd is not installed (scripts/dockerd.sh install)")
        out = subprocess.run([str(script), "start"], capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            pytest.skip(f"could not start dockerd: {(out.stderr or out.stdout).strip()[-300:]}")
        started = out.stdout.strip() == "started"
    client = docker.from_env()
    try:
        client.images.get(TEST_IMAGE)
    except docker.errors.ImageNotFound:
        out = subprocess.run([str(script), "base-image"], capture_output=True, text=True, timeout=600,
                             env={**os.environ, "BASE_IMAGE": TEST_IMAGE})
        if out.returncode != 0:
            pytest.skip(f"no {TEST_IMAGE} image and building it failed: {(out.stderr or out.stdout).strip()[-300:]}")
    yield client
    client.close()
    if started:
        subprocess.run([str(script), "stop"], capture_output=True, timeout=120)
