"""The NVFP4 solutions p55, p59 and p61, their algorithm re-computed on the CPU and judged by the judge's rule.

tests/nvfp4_model.py writes out what the kernels compute (quantization in fp32 in the kernels' order, exact
bf16 decodes, the tensor cores' fp32 accumulation per k16 step, the epilogues: bf16 for p55 and p61, fp32 for p59). Here the quantization
must give the problem's own codes, block scales and global scale bit for bit under torch's CUDA division
rule, and the outputs must stay inside mkb.tensortree.compare's allowance against the fp64 anchor, at smoke
scale and on slices with the full K and N of the problems, for round-to-nearest and cut accumulation.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from mkb.tensortree import to_anchor

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nvfp4_model as m  # noqa: E402
import numerics  # noqa: E402


BF = torch.bfloat16


def _ratio(problem, inputs, out) -> float:
    """max error / allowance of the referee's rule, the reference and anchor run with CUDA's division."""
    with m.cuda_division():
        ref = problem.reference(*inputs)
        anchor = problem.reference(*to_anchor(inputs))     # the judge's fp64 copies (p61's float globals stay)
    return numerics.ratio("out", out, ref, anchor, numerics.factor(problem))


def test_cpu_and_cuda_torch_divide_by_a_python_number_differently():
    every_bf16 = torch.arange(1, 0x7F80, dtype=torch.int32).to(torch.int16).view(BF).float()
    with m.cuda_division():
        on_cuda = every_bf16 / 6.0
    assert torch.equal(on_cuda, every_bf16 * m.INV6)
    assert (on_cuda != every_bf16 / 6.0).sum() > 1000  # the rule matters: ~1/3 of the bf16 values


@pytest.mark.parametrize("spread", [1.0, 1e3, 1e-3])
def test_kernel_quantization_is_the_problems_bit_for_bit(spread):
    problem = m.load_problem("p61")
    torch.manual_seed(61)
    t = (torch.randn(256, 512) * torch.exp(torch.randn(256, 1) * 2) * spread).to(BF)
    t[0, :16] = 0.0                                   # an all-zero block
    # a global amax whose encode 2688 / amax rounds differently as an IEEE quotient and as torch's
    # reciprocal(amax) * 2688, so that a kernel with the IEEE form fails here
    top = 2.0 ** math.ceil(math.log2(float(t.float().abs().max())))
    amax = next(a for a in (torch.tensor(top * (1 + i / 128)) for i in range(1, 128))
                if (1.0 / a) * m.ENCODE_NUM != torch.tensor(m.ENCODE_NUM, dtype=torch.float64).div(a.double()).float())
    t[1, 0] = amax
    values, sf, gdec = m.kernel_quantize(t)
    with m.cuda_division():
        packed, scale, ref_gdec = problem._nvfp4_quantize(t.float())
    assert torch.equal(sf, scale.float())
    assert torch.equal(gdec, ref_gdec)
    ref_values = problem._nvfp4_dequantize(packed, scale, torch.ones(()), torch.float32)
    assert torch.equal(values.float(), ref_values)


def _p61_slice(tokens: int, seed: int):
    """p61's full hidden 4096 and intermediate 12288, `tokens` tokens, drawn as make_inputs draws them: weights
    0.02 N(0,1) quantized with their amax global scales (torch's CUDA division), each global a Python float."""
    problem = m.load_problem("p61")
    torch.manual_seed(seed)
    x = torch.randn(1, tokens, 4096, dtype=BF)
    weights = []
    for rows, cols in ((12288, 4096), (12288, 4096), (4096, 12288)):
        with m.cuda_division():
            packed, scale, global_decode = problem._nvfp4_quantize(0.02 * torch.randn(rows, cols))
        weights += [packed, scale, global_decode.item()]
    return problem, [x, *weights]


@pytest.mark.parametrize("rounding", ["rn", "rz"])
@pytest.mark.parametrize("pid", ["p55", "p59", "p61"])
def test_inside_the_tolerance_at_smoke_scale(pid, rounding):
    problem, solve = m.load_problem(pid), {"p55": m.solve_p55, "p59": m.solve_p59, "p61": m.solve_p61}[pid]
    for seed in range(3):
        torch.manual_seed(seed)
        inputs = problem.make_inputs(device="cpu", scale="smoke")
        assert _ratio(problem, inputs, solve(problem, inputs, rounding)) < 0.5


@pytest.mark.parametrize("rounding", ["rn", "rz"])
def test_p61_inside_the_tolerance_on_a_full_width_slice(rounding):
    problem, inputs = _p61_slice(8, seed=1)
    assert all(isinstance(g, float) for g in inputs[3::3])
    assert _ratio(problem, inputs, m.solve_p61(problem, inputs, rounding)) < 0.5


def test_p55_inside_the_tolerance_on_a_full_width_slice():
    """K = 3584 and N = 8192 as at full scale; 2 sequences of 48 tokens, 16 vision tokens each, a 4096-row table."""
    problem = m.load_problem("p55")
    torch.manual_seed(55)
    batch, seq, n_vis, hidden, k = 2, 48, 16, 8192, 3584
    ids = torch.randint(0, 4096, (batch, seq))
    table = torch.randn(4096, hidden, dtype=BF)
    features = torch.randn(batch, n_vis, k, dtype=BF)
    w = problem._nvfp4_quantize(torch.randn(hidden, k) / k ** 0.5)
    bias = torch.randn(hidden, dtype=BF)
    mask = torch.zeros(batch, seq, dtype=torch.bool)
    for b in range(batch):
        mask[b, torch.randperm(seq)[:n_vis]] = True
    inputs = [ids, table, features, *w, bias, mask]
    out = m.solve_p55(problem, inputs, "rz")
    assert torch.equal(out[~mask], table[ids][~mask])          # the gathered rows are copies
    assert _ratio(problem, inputs, out) < 0.5


@pytest.mark.parametrize("rounding", ["rn", "rz"])
def test_p59_inside_the_fp32_tolerance_on_a_full_width_slice(rounding):
    """K = 4096 and N = 2816 as at full scale, 16 tokens. p59 returns fp32: where the reference's fp32
    quantization of x and the anchor's fp64 one agree (seed 101), the allowance is fp32-sized and the
    kernels' product (exact block dots, one rounding times the global scales) must sit inside it; where
    they differ in a code (seed 100, as in every full-scale draw), the kernels make the reference's choice."""
    problem = m.load_problem("p59")
    allowances = []
    for seed in (100, 101):
        torch.manual_seed(seed)
        x = torch.randn(16, 4096, dtype=BF)
        inputs = [x, *problem._nvfp4_quantize(0.02 * torch.randn(2816, 4096))]
        out = m.solve_p59(problem, inputs, rounding)
        assert out.dtype == torch.float32 and out.shape == (16, 2816)
        assert _ratio(problem, inputs, out) < 0.5
        with m.cuda_division():
            ref, anchor = problem.reference(*inputs), problem.reference(*numerics.fp64(inputs))
        allowances.append(3 * max(float((ref.double() - anchor).abs().max()),
                                  torch.finfo(torch.float32).eps * float(anchor.abs().max())))
    assert min(allowances) < 1e-4 < max(allowances)   # one draw in each regime
