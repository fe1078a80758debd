"""p51's pending solutions (problems/solutions/pending/*/p51.py), their arithmetic replayed on the CPU and judged
by the judge's own rule (mkb.tensortree.compare against the problem's reference and fp64 anchor).

The kernels cannot run here. What they compute, step for step: per expert, GEMM 1 as fp32 FMA chains of 16
products (one per k-tile, started from 0) whose sums are added to an fp32 accumulator in k order, + bias,
the clamped GLU in fp32 (the sigmoid in fp32 as torch does, or in fp64 rounded once: the TIRx kernel under
fast math); GEMM 2 the same way, + bias, times the routing weight; the combine adds a token's 4 rows in
ascending expert id. An fp32 FMA is emulated in fp64 (the product of two fp32 values is exact there).
Checked at smoke scale and on a full-scale slice (K = 2880, N = 5760 / 2880: the accumulation the GPU runs).
"""

from __future__ import annotations


import pytest
import torch


import numerics  # noqa: E402  (tests/: the replays' shared loader and tolerance ratio)

BK = 16        # the kernels' k-tile = the length of one FMA chain
F32, F64 = torch.float32, torch.float64


def _problem():
    return numerics.load_problem("p51")


def simt_gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [M, K] @ b [K, N] in the kernels' order: a fresh fp32 FMA chain per k-tile, tile sums into acc."""
    m, k = a.shape
    a64 = a.to(F64).view(m, k // BK, BK).permute(1, 0, 2)       # [KT, M, BK]
    b64 = b.to(F64).view(k // BK, BK, -1)                        # [KT, BK, N]
    tile = torch.zeros(k // BK, m, b.shape[1], dtype=F64)
    for kk in range(BK):                                         # all k-tiles' chains side by side
        tile = (tile + a64[:, :, kk, None] * b64[:, None, kk, :]).to(F32).to(F64)
    acc = torch.zeros(m, b.shape[1], dtype=F32)
    for kt in range(k // BK):
        acc = acc + tile[kt].to(F32)
    return acc


def glu(z: torch.Tensor, limit: float, alpha: float, fp64_sigmoid: bool) -> torch.Tensor:
    gate = z[:, 0::2].clamp(max=limit)
    up = z[:, 1::2].clamp(min=-limit, max=limit)
    ga = gate * alpha                                            # fp32 product, as both kernels
    sig = (1.0 / (1.0 + torch.exp(-ga.to(F64)))).to(F32) if fp64_sigmoid else torch.sigmoid(ga)
    return (up + 1) * (gate * sig)


def solve_on_cpu(problem, inputs, fp64_sigmoid: bool) -> torch.Tensor:
    x, ids, rw, w1, b1, w2, b2 = inputs
    yw = {}
    for e in torch.unique(ids).tolist():
        tok = (ids == e).any(dim=-1).nonzero().squeeze(1)
        h = glu(simt_gemm(x[tok], w1[e]) + b1[e], problem.LIMIT, problem.ALPHA, fp64_sigmoid)
        y = (simt_gemm(h, w2[e]) + b2[e]) * rw[tok, e, None]
        for i, t in enumerate(tok.tolist()):
            yw[t, e] = y[i]
    out = torch.empty_like(x)
    for t in range(x.shape[0]):                                  # ascending expert id, from the first row
        es = sorted(ids[t].tolist())
        s = yw[t, es[0]]
        for e in es[1:]:
            s = s + yw[t, e]
        out[t] = s
    return out


def _full_slice(tokens: int, experts: int, seed: int):
    """The full-scale structure (hidden 2880, intermediate 2880, 128 experts, the problem's draws) for a few
    tokens whose top-4 are taken among the first `experts` experts (only their weights are drawn)."""
    g = torch.Generator().manual_seed(seed)
    d = f = 2880
    x = torch.randn(tokens, d, generator=g)
    logits = torch.randn(tokens, 128, generator=g)
    ids = logits[:, :experts].topk(4, dim=-1).indices
    rw = torch.softmax(logits, dim=-1)
    w1 = 0.03 * torch.randn(experts, d, 2 * f, generator=g)
    b1 = 0.5 * torch.randn(experts, 2 * f, generator=g)
    w2 = torch.randn(experts, f, d, generator=g) / f ** 0.5
    b2 = 0.5 * torch.randn(experts, d, generator=g)
    return [x, ids, rw, w1, b1, w2, b2]


def _ratio(problem, inputs, out) -> float:
    """max error / allowance under the judge's rule (1.0 = at the limit)."""
    return numerics.judged_ratio(problem, inputs, out)


@pytest.mark.parametrize("fp64_sigmoid", [False, True], ids=["cutedsl", "tirx"])
def test_p51_kernel_order_passes_the_judges_rule_at_smoke_scale(fp64_sigmoid):
    problem = _problem()
    for seed in range(3):
        torch.manual_seed(seed)
        inputs = problem.make_inputs(device="cpu", scale="smoke")
        assert _ratio(problem, inputs, solve_on_cpu(problem, inputs, fp64_sigmoid)) < 0.5


def test_p51_kernel_order_passes_the_judges_rule_on_a_full_scale_slice():
    """K = 2880 in both GEMMs: a single FMA chain over K would have to hold here too; the tiled chains
    must stay well inside the allowance (measured ratios in the pending README)."""
    problem = _problem()
    inputs = _full_slice(tokens=12, experts=6, seed=1)
    ratio = _ratio(problem, inputs, solve_on_cpu(problem, inputs, fp64_sigmoid=False))
    assert ratio < 0.6, ratio
