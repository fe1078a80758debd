"""CPU replay of the pending p01 decode (problems/solutions/pending/{cutedsl,tirx}/p01.py), judged the referee's way.

The kernels' schedule and fp32 arithmetic are re-run in torch: chunks of CH tokens across sequence
boundaries, pieces (chunk ∩ sequence), eight interleaved token streams per piece, q pre-scaled by
sm_scale * log2 e in fp32, per lane an 8-term FMA chain over its dims then a 16-lane butterfly (xor 1, 2,
4, 8), an online softmax updated once per UNROLL tokens (corr = 2^(m - mx), then p = 2^(s - mx) per
token, FMAs into acc), the xor-16 merge of the two half-warp streams, the merge of the four warps, and
the in-kernel merge of a sequence's pieces in chunk order. exp2 is exact here, or with a relative
error of up to 2^-21 of random sign (ex2.approx's bound, 2 ulp). Full scale (seed 1, P01_FULL_REPLAY=1, ~3 min):
out 0.105, lse 0.20 of the allowance (0.105, 0.31 with the exp2 noise).
"""

from __future__ import annotations

import math
import os

import pytest
import torch

import numerics

CH, STREAMS, UNROLL, VEC = 256, 8, 4, 8


def _r(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32)


def _fma(a, b, c):
    """fma.rn.f32: the product and sum in fp64 (exact for these operands up to one rounding), rounded once."""
    return _r(a.double() * b.double() + c.double())


class _Exp2:
    def __init__(self, noise: bool, gen: torch.Generator):
        self.noise, self.gen = noise, gen

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.exp2(x.double())
        if self.noise:   # ex2.approx returns 1 exactly for 0 (PTX); elsewhere up to 2 ulp
            e = (torch.rand(y.shape, generator=self.gen, dtype=torch.float64) * 2 - 1) * 2.0 ** -21
            y = torch.where(x == 0, y, y * (1 + e))
        return _r(y)


def _butterfly16(parts: torch.Tensor) -> torch.Tensor:
    """Sum over the last dim (16 lanes) as xor 1, 2, 4, 8 butterflies do it, fp32 rounding at each add."""
    x = parts
    for o in (1, 2, 4, 8):
        idx = torch.arange(16) ^ o
        x = _r(x + x[..., idx])
    return x[..., 0]


def replay(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale, noise: bool = False, seed: int = 0):
    """The kernel's (out, lse) on the CPU."""
    exp2 = _Exp2(noise, torch.Generator().manual_seed(seed))
    batch, heads, d = q.shape
    kvh = k_cache.shape[2]
    g = heads // kvh
    qscale = _r(torch.tensor(float(sm_scale) * math.log2(math.e), dtype=torch.float64))
    qf = _r(q.float() * qscale).view(batch, kvh, g, 16, VEC)                   # [b, kvh, g, lane, e]
    kf = k_cache[:, 0].float()                                                 # [pages, kvh, d]
    vf = v_cache[:, 0].float()
    ptr = kv_indptr.tolist()
    total = ptr[-1]
    idx = kv_indices.long()
    partials = {}                                                              # (b, c) -> (m, l, acc)
    for c in range((total + CH - 1) // CH):
        c_lo, c_hi = c * CH, min(c * CH + CH, total)
        for b in range(batch):
            t_lo, t_hi = max(ptr[b], c_lo), min(ptr[b + 1], c_hi)
            if t_hi <= t_lo:
                continue
            m = torch.full((STREAMS, kvh, g), -1.0e30)
            l = torch.zeros(STREAMS, kvh, g)
            acc = torch.zeros(STREAMS, kvh, g, d)
            n = t_hi - t_lo
            for it in range(0, (n + STREAMS - 1) // STREAMS, UNROLL):
                toks = torch.tensor([[t_lo + s + (it + u) * STREAMS for u in range(UNROLL)] for s in range(STREAMS)])
                valid = toks < t_hi                                            # [s, u]
                rows = idx[toks.clamp(max=t_hi - 1)]                           # [s, u]
                kt = kf[rows].view(STREAMS, UNROLL, kvh, 1, 16, VEC)
                vt = vf[rows]                                                  # [s, u, kvh, d]
                chain = torch.zeros(STREAMS, UNROLL, kvh, g, 16)
                for e in range(VEC):
                    chain = _fma(qf[b][None, None, :, :, :, e], kt[..., e], chain)
                sc = _butterfly16(chain)                                       # [s, u, kvh, g]
                masked = torch.where(valid[:, :, None, None], sc, torch.tensor(-float("inf")))
                mx = torch.maximum(m, masked.amax(dim=1))
                corr = exp2(_r(m - mx))
                l = _r(l * corr)
                acc = _r(acc * corr[..., None])
                for u in range(UNROLL):
                    p = torch.where(valid[:, u, None, None], exp2(_r(sc[:, u] - mx)), torch.tensor(0.0))
                    l = _r(l + p)
                    acc = _fma(p[..., None], vt[:, u, :, None, :], acc)
                m = mx
            # halves (streams 2w, 2w + 1) merge, then the four warps in order
            m = m.view(STREAMS // 2, 2, kvh, g)
            l = l.view(STREAMS // 2, 2, kvh, g)
            acc = acc.view(STREAMS // 2, 2, kvh, g, d)
            mw = torch.maximum(m[:, 0], m[:, 1])
            wa, wb = exp2(_r(m[:, 0] - mw)), exp2(_r(m[:, 1] - mw))
            lw = _fma(l[:, 1], wb, _r(l[:, 0] * wa))
            aw = _fma(acc[:, 1], wb[..., None], _r(acc[:, 0] * wa[..., None]))
            M = mw.amax(dim=0)
            L = torch.zeros(kvh, g)
            A = torch.zeros(kvh, g, d)
            for w in range(STREAMS // 2):
                wt = exp2(_r(mw[w] - M))
                L = _fma(lw[w], wt, L)
                A = _fma(aw[w], wt[..., None], A)
            partials[b, c] = (M, L, A)
    out = torch.empty(batch, kvh, g, d, dtype=q.dtype)
    lse = torch.empty(batch, kvh, g)
    for b in range(batch):
        chunks = range(ptr[b] // CH, (ptr[b + 1] - 1) // CH + 1)
        M = torch.stack([partials[b, c][0] for c in chunks]).amax(dim=0)
        L = torch.zeros(kvh, g)
        A = torch.zeros(kvh, g, d)
        for c in chunks:
            wt = exp2(_r(partials[b, c][0] - M))
            L = _fma(partials[b, c][1], wt, L)
            A = _fma(partials[b, c][2], wt[..., None], A)
        out[b] = _r(A / L[..., None]).to(q.dtype)
        lse[b] = _r(M + _r(torch.log2(L.double())))
    return out.view(batch, heads, d), lse.view(batch, heads)


def _ratios(scale: str, seed: int, noise: bool):
    problem = numerics.load_problem("p01")
    torch.manual_seed(seed)
    inputs = problem.make_inputs(device="cpu", scale=scale)
    out, lse = replay(*inputs, noise=noise, seed=seed)
    ref = problem.reference(*inputs)
    anchor = problem.reference(*numerics.fp64(inputs))
    f = numerics.factor(problem)
    return numerics.ratio("out", out, ref[0], anchor[0], f), numerics.ratio("lse", lse, ref[1], anchor[1], f)


@pytest.mark.parametrize("noise", [False, True])
def test_p01_replay_smoke(noise):
    r_out, r_lse = _ratios("smoke", 0, noise)
    assert r_out < 0.5 and r_lse < 0.5


@pytest.mark.skipif(not os.environ.get("P01_FULL_REPLAY"), reason="3 minutes of CPU: set P01_FULL_REPLAY=1")
@pytest.mark.parametrize("noise", [False, True])
def test_p01_replay_full(noise):
    r_out, r_lse = _ratios("full", 1, noise)
    print(f"p01 full replay (noise={noise}): out {r_out:.3f}, lse {r_lse:.3f} of the allowance")
    assert r_out < 0.5 and r_lse < 0.5
