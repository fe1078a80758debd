"""The pending p52/p53 FP8 GEMM replacements on a GPU, beside the shipped kernels they replace.

The replacements keep the shipped kernels' arithmetic (per 128-wide K block four WGMMAs into a scratch fragment,
zeroed or overwritten by the first of them, one fma promotion with x_scale * w_scale, the same epilogue), so where
the shipped kernel computes the same expression the outputs must be bit for bit equal: p52 in both DSLs, p53 in TIRx (the shipped CuTe DSL
p53 rounds h to bf16 before its SwiGLU kernel; the pending one fuses it, so it is judged against the problem's
tolerance instead). Smoke scale runs the row-tail path (40 tokens in a 128-row tile). Run on the GPU machine:
`pytest -m gpu tests/test_pending_fp8_gemm_gpu.py`.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import numerics

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = ROOT / "problems" / "solutions"


def _solution(pid: str, dsl: str, pending: bool):
    path = SOLUTIONS / ("pending" if pending else "") / dsl / f"{pid}.py"
    spec = importlib.util.spec_from_file_location(f"sol_{pid}_{dsl}_{pending}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.gpu
@pytest.mark.parametrize("scale", ["smoke", "full"])
@pytest.mark.parametrize("pid, dsl", [("p52", "cutedsl"), ("p52", "tirx"), ("p53", "cutedsl"), ("p53", "tirx")])
def test_pending_gemm_matches_the_shipped_kernel(pid, dsl, scale):
    if not (SOLUTIONS / "pending" / dsl / f"{pid}.py").exists():
        pytest.skip(f"no pending {dsl} {pid} (moved up)")
    problem = numerics.load_problem(pid)
    torch.manual_seed(20)
    inputs = problem.make_inputs(device="cuda", scale=scale)
    new = _solution(pid, dsl, pending=True).solve(*inputs)
    torch.cuda.synchronize()
    ratio = numerics.judged_ratio(problem, inputs, new)
    assert ratio < 0.5, ratio
    if (pid, dsl) != ("p53", "cutedsl"):
        old = _solution(pid, dsl, pending=False).solve(*inputs)
        assert torch.equal(new.view(torch.int16), old.view(torch.int16))
