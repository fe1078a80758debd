"""Shared fixtures: isolated MKB_HOME per test, real DuckDB stores, GPU tests that skip themselves."""

from __future__ import annotations

import pytest


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


@pytest.fixture(autouse=True)
def mkb_home(tmp_path, monkeypatch):
    """Every test gets its own MKB_HOME (database, workspaces, caches) under tmp_path."""
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
