"""The reference solutions (problems/solutions/<dsl>/pNN.py, and pending/<dsl>/pNN.py not yet graded on a
GPU), checked without a GPU.

Their correctness and speed are graded on the H200 (artifact/generators/validate_solutions.py, the
`solutions` stage of scripts/gpu_session.sh, which reads the same file list). Here, on a CPU: every
problem is solved in both DSLs, the GPU grading lists each variant, the judge's static scan accepts
the file, and its kernels build for sm_90a from the problem's smoke inputs (CuTe DSL down to a cubin
inside the wheel; TIRx to CUDA C, and to a cubin where nvcc is installed).
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mkb.judge import static
from mkb.records import Dsl

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = ROOT / "problems" / "solutions"
sys.path.insert(0, str(ROOT / "artifact" / "generators"))
from validate_solutions import shipped  # noqa: E402  (the GPU grading's own list)


def _found(where: Path) -> dict[tuple[str, str], Path]:
    return {(p.stem, dsl): p for dsl in ("cutedsl", "tirx") for p in (where / dsl).glob("p[0-9][0-9].py")}


SHIPPED_PATHS, PENDING_PATHS = _found(SOLUTIONS), _found(SOLUTIONS / "pending")
SHIPPED, PENDING = sorted(SHIPPED_PATHS), sorted(PENDING_PATHS)
VARIANTS = sorted(set(SHIPPED) | set(PENDING))
# every file is its own case: a pending replacement of a shipped solution (same pNN) is "pNN-dsl-pending"
CASES = [pytest.param(pid, dsl, path, id=f"{pid}-{dsl}{tag}")
         for paths, tag in ((SHIPPED_PATHS, ""), (PENDING_PATHS, "-pending"))
         for (pid, dsl), path in sorted(paths.items())]


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _problem_file(pid: str) -> Path:
    hits = sorted(ROOT.glob(f"problems/*/{int(pid[1:]):02d}_*.py"))
    assert len(hits) == 1, f"{pid}: {hits}"
    return hits[0]


def test_every_solved_problem_has_both_dsls_and_is_graded_on_the_gpu():
    for group in (SHIPPED, PENDING):  # shipped, and pending apart
        by_dsl = {dsl: {pid for pid, d in group if d == dsl} for dsl in ("cutedsl", "tirx")}
        assert by_dsl["cutedsl"] == by_dsl["tirx"]
    assert len(SHIPPED) >= 24 and len(VARIANTS) >= 36
    assert sorted((pid, dsl) for pid, dsl, _ in shipped(None, ["cutedsl", "tirx"])) == SHIPPED
    graded = sorted((pid, dsl) for pid, dsl, _ in shipped(None, ["cutedsl", "tirx"], pending=True))
    assert graded == sorted(SHIPPED + PENDING)  # a pending replacement is graded beside the shipped file
    for pid in {pid for pid, _ in VARIANTS}:
        _problem_file(pid)


@pytest.mark.parametrize("pid, dsl, path", CASES)
def test_the_judges_static_scan_accepts_the_solution(pid, dsl, path):
    source = path.read_text()
    assert static.scan(source, Dsl(dsl)) == []
    other = "tvm" if dsl == "cutedsl" else "cutlass"
    assert f"import {other}" not in source and f"from {other}" not in source


@pytest.mark.parametrize("pid, dsl, path", CASES)
def test_the_solution_builds_for_sm90a_from_smoke_inputs(pid, dsl, path, tmp_path):
    import torch

    problem = _load(_problem_file(pid), f"problem_{pid}")
    torch.manual_seed(0)
    inputs = problem.make_inputs(device="cpu", scale="smoke")
    solution = _load(path, f"solution_{dsl}_{pid}_{path.parent.parent.name}")
    built = list(solution._prepare(*inputs, arch="sm_90a"))
    assert built, "the solution builds no kernel"
    if dsl == "cutedsl":
        assert all(callable(fn) for fn in built)
        return
    nvcc = shutil.which("nvcc")
    for i, exe in enumerate(built):
        source = exe.mod.imports[0].inspect_source()
        assert "__global__" in source, "TIRx built no CUDA kernel"
        if nvcc:  # the machine code too, where a CUDA toolkit is installed (CI has none)
            cu = tmp_path / f"k{i}.cu"
            cu.write_text(source)
            done = subprocess.run([nvcc, "-arch=sm_90a", "-cubin", "-use_fast_math", "-w", "-o",
                                   str(tmp_path / f"k{i}.cubin"), str(cu)], capture_output=True, text=True)
            assert done.returncode == 0, done.stderr[-2000:]
