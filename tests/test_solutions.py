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
import json
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
from validate_solutions import CEILINGS_BY_GPU, gpu_key, gradings, rescore, shipped  # noqa: E402  (the GPU grading's own)

# Keyed by (problem, dsl, where): a pending replacement of a shipped solution (same name) is its own case.
PATHS = {(p.stem, dsl, where.name): p for dsl in ("cutedsl", "tirx") for where in (SOLUTIONS, SOLUTIONS / "pending")
         for p in (where / dsl).glob("p[0-9][0-9].py")}
CASES = sorted(PATHS)
IDS = [f"{pid}-{dsl}" + ("-pending" if where == "pending" else "") for pid, dsl, where in CASES]
SHIPPED = sorted((pid, dsl) for pid, dsl, where in CASES if where == "solutions")
PENDING = sorted((pid, dsl) for pid, dsl, where in CASES if where == "pending")


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
    solved = {pid for pid, _ in SHIPPED}
    new = [(pid, dsl) for pid, dsl in PENDING if pid not in solved]  # a replacement may be of one DSL only
    for group in (SHIPPED, new):  # shipped, and new problems pending apart
        by_dsl = {dsl: {pid for pid, d in group if d == dsl} for dsl in ("cutedsl", "tirx")}
        assert by_dsl["cutedsl"] == by_dsl["tirx"]
    assert len(SHIPPED) >= 24 and len(set(SHIPPED) | set(PENDING)) >= 36
    assert sorted((pid, dsl) for pid, dsl, _ in shipped(None, ["cutedsl", "tirx"])) == SHIPPED
    # with pending, a pending replacement is graded instead of the shipped file of the same name
    graded = {(pid, dsl): path for pid, dsl, path in shipped(None, ["cutedsl", "tirx"], pending=True)}
    assert sorted(graded) == sorted(set(SHIPPED) | set(PENDING))
    assert all(path == PATHS[pid, dsl, "pending" if (pid, dsl) in PENDING else "solutions"]
               for (pid, dsl), path in graded.items())
    for pid in {pid for pid, _, _ in CASES}:
        _problem_file(pid)


def test_every_shipped_variant_has_a_passing_gpu_grading_of_its_own_file():
    by_gpu = gradings()
    assert "h200" in by_gpu
    for pid, dsl in SHIPPED:
        records = [r for rows in by_gpu.values() for r in rows if (r["problem"], r["dsl"]) == (pid, dsl)]
        assert records, f"{pid} {dsl}: shipped without a GPU grading"
        for record in records:   # every GPU's latest grading of a shipped file passed, of that very file
            assert record["status"] == "passed" and record["dsl_check"] == "passed", (pid, dsl, record["device"])
            assert record["kernel_file"] == f"problems/solutions/{dsl}/{pid}.py"
    for key, rows in by_gpu.items():   # each records file holds one GPU's gradings, named after it
        assert {gpu_key(r["device"]) for r in rows} == {key}


def test_a_gpu_is_keyed_by_its_model_and_its_sol_fields_follow_its_ceilings():
    assert gpu_key("NVIDIA H200") == "h200" and gpu_key("NVIDIA H100 80GB HBM3") == "h100"
    assert gpu_key("NVIDIA H100-SXM5-80GB") == "h100"
    with pytest.raises(ValueError):
        gpu_key("NVIDIA")

    class Info:
        dtype, sol_flops, sol_bytes = "bf16", 790e9, 4.3e9   # 1 ms of flops on the H200, 1 ms of bytes
    rows = rescore([{"problem": "p99", "kernel_ms": 2.0}], {"p99": Info()}, CEILINGS_BY_GPU["h200"])
    assert rows[0]["sol_ms"] == pytest.approx(1.0) and rows[0]["sol_fraction"] == pytest.approx(0.5)
    rows = rescore(rows, {"p99": Info()}, None)   # a GPU not measured yet: no SOL figures, not a guess
    assert rows[0]["sol_ms"] is None and rows[0]["sol_fraction"] is None


def test_docs_solutions_is_what_the_generator_renders_from_the_records(tmp_path):
    out = tmp_path / "solutions.md"
    subprocess.run([sys.executable, str(ROOT / "artifact/generators/solutions_table.py"),
                    str(SOLUTIONS / "h200_standalone_check.json"), str(out)], check=True, cwd=ROOT)
    assert out.read_text() == (ROOT / "docs/solutions.md").read_text(), \
        "docs/solutions.md is stale: run python artifact/generators/solutions_table.py"


def test_a_pending_replacement_is_a_case_of_its_own():
    replaced = set(SHIPPED) & set(PENDING)
    for pid, dsl in replaced:
        assert f"{pid}-{dsl}" in IDS and f"{pid}-{dsl}-pending" in IDS
    assert len(IDS) == len(set(IDS)) == len(SHIPPED) + len(PENDING)


@pytest.mark.parametrize("pid, dsl, where", CASES, ids=IDS)
def test_the_judges_static_scan_accepts_the_solution(pid, dsl, where):
    source = PATHS[pid, dsl, where].read_text()
    assert static.scan(source, Dsl(dsl)) == []
    other = "tvm" if dsl == "cutedsl" else "cutlass"
    assert f"import {other}" not in source and f"from {other}" not in source


@pytest.mark.parametrize("pid, dsl, where", CASES, ids=IDS)
def test_the_solution_builds_for_sm90a_from_smoke_inputs(pid, dsl, where, tmp_path):
    import torch

    problem = _load(_problem_file(pid), f"problem_{pid}")
    torch.manual_seed(0)
    inputs = problem.make_inputs(device="cpu", scale="smoke")
    solution = _load(PATHS[pid, dsl, where], f"solution_{dsl}_{pid}_{where}")
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


def test_promotion_moves_a_new_problem_up_only_with_both_dsls_and_a_replacement_alone():
    from promote_solutions import plan

    def rec(pid, dsl, status="passed", where="pending"):
        folder = "problems/solutions/pending" if where == "pending" else "problems/solutions"
        return {"problem": pid, "dsl": dsl, "status": status, "dsl_check": "passed", "device": "NVIDIA H100",
                "kernel_file": f"{folder}/{dsl}/{pid}.py", "message": ""}

    new = next(f"p{i:02d}" for i in range(1, 75) if (f"p{i:02d}", "cutedsl") not in SHIPPED)   # shipped in no DSL
    keep, stay = plan([rec(new, "cutedsl"), rec(new, "tirx")])
    assert [r["kernel_file"] for r in keep] == [f"problems/solutions/cutedsl/{new}.py", f"problems/solutions/tirx/{new}.py"]
    keep, stay = plan([rec(new, "cutedsl"), rec(new, "tirx", status="failed")])
    assert keep == [] and len(stay) == 2 and "its tirx variant did not pass" in stay[0]
    shipped_pid, dsl = SHIPPED[0]   # a replacement of a shipped file moves up alone
    keep, stay = plan([rec(shipped_pid, dsl), rec("p28", "cutedsl", where="solutions")])
    assert [r["kernel_file"] for r in keep] == [f"problems/solutions/{dsl}/{shipped_pid}.py",
                                                "problems/solutions/cutedsl/p28.py"] and stay == []


def test_a_record_knows_whether_its_file_changed_since_the_grading():
    import hashlib

    from validate_solutions import source_changed

    pid, dsl = SHIPPED[0]
    kernel_file = f"problems/solutions/{dsl}/{pid}.py"
    digest = hashlib.sha256((ROOT / kernel_file).read_bytes()).hexdigest()
    assert source_changed({"kernel_file": kernel_file, "kernel_sha256": digest}) is False
    assert source_changed({"kernel_file": kernel_file, "kernel_sha256": "0" * 64}) is True
    assert source_changed({"kernel_file": kernel_file, "versions": {}}) is None
