"""CPU replays of the pending linear-attention solutions' arithmetic (p65, p71), checked against the problems.

The GPU grades the kernels; here their exact order is replayed in torch fp32 on the CPU, with every
`acc + a * b` of the kernels as one FMA rounding (both DSLs contract them), and compared with the
problem's reference under the judge's tolerance rule (mkb.tensortree.compare against the fp64 anchor).

p71 (GDN varlen prefill): the fp64 gates rounded once, alpha * S, each lane's 16 rows in 4 interleaved
FMA partial sums combined (p0 + p1) + (p2 + p3), the 8 lanes of a column summed by a butterfly (xor 1,
2, 4 in CuTe DSL; TIRx's 8-lane warp sum uses xor 4, 2, 1), delta = (v - k.S') * beta, the FMA update,
o = (q.S) * scale rounded to bf16; at smoke scale and on a full-scale slice (head dim 128, 8 of the 16
v heads, the first sequences of the problem's cu_seqlens with the long one cut to 256 tokens). The
whole problem (959 tokens, 16 heads) takes ~4 CPU minutes per draw; measured once: o at 0.08-0.09 and
the final states at 0.31-0.38 of the allowance (two draws, both lane orders).

p65 (Mamba2 SSD diagonal block): C B^T as one FMA chain per entry over the state dim, the log-decays
scanned Hillis-Steele style in fp32, M = CB * exp(cs_l - cs_s) (exp rounded once) masked to s <= l, y as
one FMA chain per output over s ascending, rounded to bf16; at smoke scale and on full-scale slices (2 of
the 16 sequences, every head).
"""

from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F

from mkb import tensortree as tt

import numerics  # noqa: E402  (tests/: the replays' shared loader and tolerance ratio)

RT = 8          # p71: lanes per column


def _fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """fp32 a * b + c with one rounding (the fp64 product of two fp32 values is exact)."""
    return (a.double() * b.double() + c.double()).float()


def _dot(x: torch.Tensor, s: torch.Tensor, order: tuple[int, ...]) -> torch.Tensor:
    """x, s [..., RT, R]: per-lane interleaved partial sums, then the lane tree -> [...]."""
    r = x.shape[-1]
    npart = min(4, r)
    part = [torch.zeros(x.shape[:-1], dtype=torch.float32) for _ in range(npart)]
    for i in range(r):
        part[i % npart] = _fma(x[..., i], s[..., i], part[i % npart])
    lane = (part[0] + part[1]) + (part[2] + part[3]) if npart == 4 else (part[0] + part[1] if npart == 2 else part[0])
    idx = torch.arange(RT)
    for off in order:                          # butterfly: every lane ends with the same sum
        lane = lane + lane[..., idx ^ off]
    return lane[..., 0]


def _gates(A_log, a, dt_bias, b):
    """alpha, beta [T, Hv] in fp64, rounded once to fp32 (the kernels' gate chunk)."""
    x = a.float().double() + dt_bias.double()
    sp = torch.where(x > 20, x, torch.log1p(torch.exp(x)))
    alpha = torch.exp(-torch.exp(A_log.double()) * sp).float()
    beta = (1.0 / (1.0 + torch.exp(-b.float().double()))).float()
    return alpha, beta


def p71_model(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, order=(1, 2, 4)):
    """The p71 kernels' arithmetic: (o bf16 [T, Hv, D], final states fp32 [N, Hv, V, K])."""
    hk, hv, dk = q.shape[1], v.shape[1], q.shape[2]
    rep, r = hv // hk, dk // RT
    alpha, beta = _gates(A_log, a, dt_bias, b)
    kq = k.float().repeat_interleave(rep, dim=1).view(-1, hv, 1, RT, r)   # broadcast over the columns j
    qq = q.float().repeat_interleave(rep, dim=1).view(-1, hv, 1, RT, r)
    o = torch.empty(v.shape, dtype=q.dtype)
    final = torch.empty(state.shape, dtype=torch.float32)
    bounds = cu_seqlens.tolist()
    for n, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        s = state[n].float().reshape(hv, -1, RT, r).clone()                 # [Hv, V(j), lane, rows]
        for t in range(start, end):
            s = s * alpha[t, :, None, None, None]
            ks = _dot(kq[t].expand_as(s), s, order)                           # [Hv, V]
            delta = (v[t].float() - ks) * beta[t, :, None]
            s = _fma(kq[t].expand_as(s), delta[..., None, None].expand_as(s), s)
            ot = _dot(qq[t].expand_as(s), s, order)
            o[t] = (ot * scale).to(q.dtype)
        final[n] = s.reshape(state.shape[1:])
    return o, final


def _ratios(problem, inputs, order):
    out = p71_model(*inputs, order=order)
    ref = problem.reference(*inputs)
    anchor = problem.reference(*numerics.fp64(inputs))
    return [numerics.ratio(name, o, rf, an) for name, o, rf, an in zip(("o", "state"), out, ref, anchor)]


@pytest.mark.parametrize("order", [(1, 2, 4), (4, 2, 1)], ids=["cutedsl", "tirx"])
@pytest.mark.parametrize("scale", ["smoke", "slice"])
def test_p71_kernel_arithmetic_is_well_inside_the_tolerance(scale, order):
    problem = numerics.load_problem("p71")
    torch.manual_seed(71)
    inputs = problem.make_inputs(device="cpu", scale="smoke" if scale == "smoke" else "full")
    if scale == "slice":  # v heads 4..11 (q/k heads 2..5), sequences (19, 31, 256 of the 890)
        q, k, v, state, A_log, a, dt_bias, b, cu, sc = inputs
        hv, tok = slice(4, 12), slice(0, 306)
        inputs = [q[tok, 2:6], k[tok, 2:6], v[tok, hv], state[:3, hv], A_log[hv], a[tok, hv], dt_bias[hv],
                  b[tok, hv], torch.tensor([0, 19, 50, 306]), sc]
    o_ratio, state_ratio = _ratios(problem, inputs, order)
    assert o_ratio < 0.5 and state_ratio < 0.5, (o_ratio, state_ratio)


def test_the_p71_model_is_the_recurrence():
    """The replay is the problem's recurrence (same inputs, same answer up to rounding), not a lookalike."""
    problem = numerics.load_problem("p71")
    torch.manual_seed(7)
    inputs = problem.make_inputs(device="cpu", scale="smoke")
    o, final = p71_model(*inputs)
    ref_o, ref_final = problem.reference(*inputs)
    assert (o.float() - ref_o.float()).abs().max() <= 2 * 2 ** -8 * ref_o.float().abs().max()
    assert torch.allclose(final, ref_final, rtol=1e-4, atol=1e-5)
    assert not torch.equal(final, inputs[3])   # the states moved
    assert F.mse_loss(final, ref_final) < 1e-10


def _scan(a: torch.Tensor) -> torch.Tensor:
    """Hillis-Steele inclusive scan over the last dim in fp32 (cs[t] += cs[t - d], d = 1, 2, 4, ...)."""
    cs, d = a.clone(), 1
    while d < a.shape[-1]:
        shifted = torch.zeros_like(cs)
        shifted[..., d:] = cs[..., :-d]
        cs, d = cs + shifted, 2 * d
    return cs


def p65_model(x, a, b, c):
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


def _p65_ratio(problem, inputs) -> float:
    return numerics.judged_ratio(problem, inputs, p65_model(*inputs), "y")


@pytest.mark.parametrize("scale", ["smoke", "slice"])
def test_p65_kernel_arithmetic_is_well_inside_the_tolerance(scale):
    problem = numerics.load_problem("p65")
    torch.manual_seed(65)
    inputs = problem.make_inputs(device="cpu", scale="smoke" if scale == "smoke" else "full")
    if scale == "slice":  # 2 of the 16 sequences: every head, group and the full chunk of 128
        inputs = [t[:2] for t in inputs]
    assert _p65_ratio(problem, inputs) < 0.5


def test_a_wrong_p65_decay_is_caught():
    """The check can fail: the same replay with the decay's sign flipped is far outside the tolerance."""
    problem = numerics.load_problem("p65")
    torch.manual_seed(66)
    x, a, b, c = problem.make_inputs(device="cpu", scale="smoke")
    out = p65_model(x, -a, b, c)
    ref = problem.reference(x, a, b, c)
    anchor = problem.reference(x.double(), a.double(), b.double(), c.double())
    assert not tt.compare("y", out, ref, anchor, 3.0).ok
