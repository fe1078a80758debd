"""CPU replay of the pending p65 solutions' arithmetic (Mamba2 SSD intra-chunk diagonal), checked against the problem.

The GPU grades the kernels; here their order is replayed in torch fp32 on the CPU: C B^T as one FMA
chain per entry over the state dim (n ascending), the log-decays scanned Hillis-Steele style in fp32,
M = CB * exp(cs_l - cs_s) (exp rounded once) masked to s <= l, and y as one FMA chain per output over
s ascending, rounded to bf16. It must stay well inside the judge's tolerance (mkb.tensortree.compare
against the fp64 anchor) at smoke scale and on full-scale slices (2 of the 16 sequences, every head).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from mkb import tensortree as tt

ROOT = Path(__file__).resolve().parents[1]


def _problem():
    (path,) = sorted(ROOT.glob("problems/linear_attention/65_*.py"))
    spec = importlib.util.spec_from_file_location("numerics_p65", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """fp32 a * b + c with one rounding (the fp64 product of two fp32 values is exact)."""
    return (a.double() * b.double() + c.double()).float()


def _scan(a: torch.Tensor) -> torch.Tensor:
    """Hillis-Steele inclusive scan over the last dim in fp32 (cs[t] += cs[t - d], d = 1, 2, 4, ...)."""
    cs, d = a.clone(), 1
    while d < a.shape[-1]:
        shifted = torch.zeros_like(cs)
        shifted[..., d:] = cs[..., :-d]
        cs, d = cs + shifted, 2 * d
    return cs


def kernel_model(x, a, b, c):
    """The p65 kernels' arithmetic: y bf16 [B, 1, L, H, P]."""
    bs, _, l, h, p = x.shape
    g, n = b.shape[3], b.shape[4]
    cf = c[:, 0].float().permute(0, 2, 1, 3)                   # [B, G, L, N]
    bf = b[:, 0].float().permute(0, 2, 1, 3)
    cb = torch.zeros(bs, g, l, l, dtype=torch.float32)
    for i in range(n):                                         # one FMA chain per (l, s), n ascending
        cb = _fma(cf[..., :, None, i], bf[..., None, :, i], cb)
    cs = _scan(a[:, :, 0].float())                             # [B, H, L]
    decay = torch.exp((cs[..., :, None] - cs[..., None, :]).double()).float()
    keep = torch.ones(l, l, dtype=torch.bool).tril()
    m = torch.where(keep, cb.repeat_interleave(h // g, dim=1) * decay, torch.zeros(()))   # [B, H, L(l), L(s)]
    xf = x[:, 0].float().permute(0, 2, 1, 3)                   # [B, H, L(s), P]
    acc = torch.zeros(bs, h, l, p, dtype=torch.float32)
    for s in range(l):                                         # one FMA chain per output, s ascending
        acc = _fma(m[..., :, s, None], xf[..., s, None, :], acc)
    return acc.permute(0, 2, 1, 3)[:, None].to(x.dtype)


def _ratio(problem, inputs) -> float:
    out = kernel_model(*inputs)
    ref = problem.reference(*inputs)
    anchor = problem.reference(*(t.double() for t in inputs))
    c = tt.compare("y", out, ref, anchor, 3.0)
    assert c.ok, c.note
    return c.max_error / c.allowance


@pytest.mark.parametrize("scale", ["smoke", "slice"])
def test_p65_kernel_arithmetic_is_well_inside_the_tolerance(scale):
    problem = _problem()
    torch.manual_seed(65)
    inputs = problem.make_inputs(device="cpu", scale="smoke" if scale == "smoke" else "full")
    if scale == "slice":  # 2 of the 16 sequences: every head, group and the full chunk of 128
        inputs = [t[:2] for t in inputs]
    assert _ratio(problem, inputs) < 0.5


def test_a_wrong_decay_is_caught():
    """The check can fail: the same replay with the decay's sign flipped is far outside the tolerance."""
    problem = _problem()
    torch.manual_seed(66)
    x, a, b, c = problem.make_inputs(device="cpu", scale="smoke")
    out = kernel_model(x, -a, b, c)
    ref = problem.reference(x, a, b, c)
    anchor = problem.reference(x.double(), a.double(), b.double(), c.double())
    assert not tt.compare("y", out, ref, anchor, 3.0).ok
