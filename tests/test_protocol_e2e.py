"""The protocol end to end on CPU: scripted model server, real judge (CPU mode), real DuckDB, real processes.

2 problems x 4 arms x 2 replicates; then a kill mid-run and a resume; a stale problem; the dry-run plan.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from scripted_server import call, reply

from mkb.cli import main
from mkb.settings import load_settings

KERNELS = {
    "p28": '''import torch

def solve(x, residual, weight):
    s = x.float() + residual.float()
    out = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()
    return out.to(x.dtype)
''',
    "p25": '''import torch

def solve(src_k, src_v, dst_k, dst_v, block_mapping):
    dst_k[block_mapping[:, 1]] = src_k[block_mapping[:, 0]]
    dst_v[block_mapping[:, 1]] = src_v[block_mapping[:, 0]]
''',
}
PROBLEMS = "p25,p28"


def responder(body: dict) -> dict:
    """A stateless scripted model: write the kernel, write the skill, finish (by conversation length)."""
    messages = body["messages"]
    problem = re.search(r"\bp(\d\d)\b", messages[0]["content"] + messages[1]["content"]).group(0)
    turn = sum(m["role"] == "assistant" for m in messages)
    if turn == 0:
        return reply("kernel", [call("write_file", {"path": "kernel.py", "content": KERNELS[problem]})])
    if turn == 1:
        return reply("skill", [call("write_file", {"path": "SKILL.md",
                                                   "content": f"# {problem}\nFuse the passes; one read, one write."})])
    return reply("done", [call("finish", {})])


def _args(db: Path, *extra: str) -> list[str]:
    return ["--db", str(db), "run-model", "vllm/scripted", "--problems", PROBLEMS, "--replicates", "2",
            "--device", "cpu", "--concurrency", "4", "--budget-s", "300", *extra]


def _trials(db: Path) -> dict[str, dict]:
    out = CliRunner().invoke(main, ["--db", str(db), "db", "query",
                                    "SELECT trial_id, state, status, arm, dsl, skill_sha256 FROM trials", "--json"])
    return {r["trial_id"]: r for r in json.loads(out.stdout)}


@pytest.fixture
def server(llm_server):
    llm_server.script([responder] * 500)
    return llm_server


def test_full_protocol_then_resume_after_kill_then_stale(server, tmp_path, monkeypatch):
    problems = tmp_path / "problems"
    shutil.copytree(load_settings().problems_dir, problems, ignore=shutil.ignore_patterns("solutions"))
    monkeypatch.setenv("MKB_PROBLEMS_DIR", str(problems))
    db = tmp_path / "run.duckdb"
    base = ["--base-url", server.base_url]

    dry = CliRunner().invoke(main, _args(db, *base, "--dry-run"))
    assert dry.exit_code == 0, dry.stderr
    assert "0 reuse, 16 run" in dry.stderr and not db.exists()

    # a first run, killed as soon as some trials are recorded
    env = {**os.environ, "MKB_PROBLEMS_DIR": str(problems)}
    proc = subprocess.Popen([sys.executable, "-m", "mkb", *_args(db, *base)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    assert server.wait_for_requests(6, timeout_s=120)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    time.sleep(0.2)  # let the OS release the DuckDB file lock of the killed process

    # resume: every trial ends finished; nothing recorded twice
    resumed = CliRunner().invoke(main, _args(db, *base))
    assert resumed.exit_code == 0, resumed.stderr
    trials = _trials(db)
    assert len(trials) == 16
    assert {t["state"] for t in trials.values()} == {"finished"}
    # torch-only kernels: CuTe DSL cannot run on a CPU (DSL check not_checked, so passed), while the TIRx
    # check is real on a CPU and finds no TIRx kernel (policy_violation)
    assert {(t["dsl"], t["status"]) for t in trials.values()} == {("cutedsl", "passed"), ("tirx", "policy_violation")}
    skill = trials["p28_r1_cutedsl2tirx_skill"]
    assert skill["skill_sha256"]
    again = CliRunner().invoke(main, _args(db, *base, "--dry-run"))
    assert "16 reuse, 0 run, 0 rerun, 0 stale" in again.stderr

    # edit a problem: its trials go stale and block the run with a one-line error
    p28 = next(problems.glob("mlp_norm/28_*.py"))
    p28.write_text(p28.read_text() + "\n# edited\n")
    stale = CliRunner().invoke(main, _args(db, *base))
    assert stale.exit_code == 1
    assert "Error: 8 trials are stale (changed: problem; its source solo is stale)" in stale.stderr
    assert "--rerun-stale" in stale.stderr
