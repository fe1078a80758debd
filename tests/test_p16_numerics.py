"""CPU replay of the pending p16 tensor-core prefill (problems/solutions/pending/{cutedsl,tirx}/p16.py), judged the
referee's way.

The kernels' schedule and arithmetic are re-run in torch: a tile of 64 query rows per (sequence, head) (rows past
the sequence's queries clamped to its last one, not compared), key blocks of 64 (rows past the sequence clamped),
S = Q K^T by m16n8k16 steps in chunks of KC steps, each chunk into a fresh accumulator then added in fp32;
t = S * (sm_scale * log2 e) in fp32, the causal mask, the online softmax per block (corr = 2^(m - m_new),
p = 2^(t - m_new)), the row sum kept per lane (lane tq of the quad sums its 16 keys of a block in order, the
quad summed at the end as the xor 1, 2 shuffles do it), P rounded to bf16 for O += P V (k16 steps), out =
bf16(O * (1 / l)), lse = m + log2 l.

An mma step is modelled as the exact sum of its 16 products and the accumulator, rounded once to fp32: to
nearest ("rn") or toward zero ("rz", the pessimistic reading of the tensor core's truncating normalisation: a
bias of half an ulp a step on the large partial sums, which is why S is accumulated in chunks). exp2 is exact
or carries up to 2 ulp of random sign (ex2.approx), log2 up to 2^-22 absolute (lg2.approx, TIRx).

Full scale (seed 1, P16_FULL_REPLAY=1, ~20 s a configuration), max error / allowance: out 0.10; lse 0.52 (KC = 12,
the kernels' choice; "rz" with noise), 0.50 (KC = 4), 0.46 (KC = 4, "rn" with noise), 0.29 (exact exp2, "rn").
The same model of the shipped CUDA-core p16 (6-term FMA chains per lane, a 32-lane butterfly, one serial row sum)
gives lse 2.1-2.3e-6 (0.55-0.60), the error its H200 records show (1.9-2.5e-6); this kernel's model 1.99e-6.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

import numerics

QT, BN = 64, 64


def _r(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32)


def _round(x64: torch.Tensor, mode: str) -> torch.Tensor:
    y = x64.to(torch.float32)
    if mode == "rz":   # step back toward zero where rounding to nearest went away from it
        away = y.double().abs() > x64.abs()
        y = torch.where(away, torch.nextafter(y, torch.zeros_like(y)), y)
    return y


def _mma_steps(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, mode: str) -> torch.Tensor:
    """acc [.., M, N] += a [.., M, K] @ b [.., K, N] in k16 steps, each step's exact sum rounded once."""
    for k in range(0, a.shape[-1], 16):
        acc = _round(acc.double() + a[..., k:k + 16].double() @ b[..., k:k + 16, :].double(), mode)
    return acc


class _Exp2:
    def __init__(self, noise: bool, gen: torch.Generator):
        self.noise, self.gen = noise, gen

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.exp2(x.double())
        if self.noise:   # ex2.approx returns 1 exactly for 0 (PTX); elsewhere up to 2 ulp
            e = (torch.rand(y.shape, generator=self.gen, dtype=torch.float64) * 2 - 1) * 2.0 ** -21
            y = torch.where(x == 0, y, y * (1 + e))
        return _r(y)


def replay(q, k, v, qo_indptr, kv_indptr, sm_scale, kc: int = 4, mode: str = "rz", noise: bool = False,
           seed: int = 0):
    """The kernel's (out, lse) on the CPU."""
    gen = torch.Generator().manual_seed(seed)
    exp2 = _Exp2(noise, gen)
    total_q, heads, dqk = q.shape
    dv = v.shape[2]
    qscale = _r(torch.tensor(float(sm_scale) * math.log2(math.e), dtype=torch.float64))
    out = torch.empty(total_q, heads, dv, dtype=q.dtype)
    lse = torch.empty(total_q, heads)
    qo, kvp = qo_indptr.tolist(), kv_indptr.tolist()
    for b in range(len(qo) - 1):
        qlen, kvlen = qo[b + 1] - qo[b], kvp[b + 1] - kvp[b]
        off = kvlen - qlen
        for i0 in range(0, qlen, QT):
            nq = min(QT, qlen - i0)
            kend = i0 + nq + off
            rows = torch.arange(QT)
            qt = q[qo[b] + i0 + rows.clamp(max=nq - 1)].transpose(0, 1).float()          # [H, 64, dqk]
            m = torch.full((heads, QT), -1.0e30)
            lane_l = torch.zeros(heads, QT, 4)
            o = torch.zeros(heads, QT, dv)
            for kb in range((kend + BN - 1) // BN):
                keys = kb * BN + torch.arange(BN)
                krows = kvp[b] + keys.clamp(max=kend - 1)
                kt = k[krows].transpose(0, 1).float()                                      # [H, 64, dqk]
                vt = v[krows].transpose(0, 1).float()                                      # [H, 64, dv]
                s = None
                for c in range(0, dqk, 16 * kc):
                    part = _mma_steps(torch.zeros(heads, QT, BN), qt[..., c:c + 16 * kc],
                                      kt[..., c:c + 16 * kc].transpose(1, 2), mode)
                    s = part if s is None else _r(s + part)
                t = _r(s * qscale)
                visible = keys[None, :] <= (i0 + rows)[:, None] + off                      # [64, 64]
                t = torch.where(visible[None], t, torch.tensor(-1.0e38))
                m_new = torch.maximum(m, t.amax(dim=-1))
                corr = exp2(_r(m - m_new))
                p = exp2(_r(t - m_new[..., None]))                                         # [H, 64, 64]
                lane_l = _r(lane_l * corr[..., None])
                pl = p.view(heads, QT, BN // 8, 4, 2)                                      # key = 8 nt + 2 tq + e
                for nt in range(BN // 8):
                    for e in range(2):
                        lane_l = _r(lane_l + pl[:, :, nt, :, e])
                o = _r(o * corr[..., None])
                o = _mma_steps(o, p.to(torch.bfloat16).float(), vt, mode)
                m = m_new
            l = _r(_r(lane_l[..., 0] + lane_l[..., 1]) + _r(lane_l[..., 2] + lane_l[..., 3]))
            inv = _r(1.0 / l.double())
            log2l = torch.log2(l.double())
            if noise:
                log2l = log2l + (torch.rand(log2l.shape, generator=gen, dtype=torch.float64) * 2 - 1) * 2.0 ** -22
            res = _r(o * inv[..., None]).to(q.dtype)
            ls = _r(m + _r(log2l))
            out[qo[b] + i0:qo[b] + i0 + nq] = res[:, :nq].transpose(0, 1)
            lse[qo[b] + i0:qo[b] + i0 + nq] = ls[:, :nq].transpose(0, 1)
    return out, lse


def ratios(scale: str, seed: int, **kw) -> tuple[float, float]:
    problem = numerics.load_problem("p16")
    torch.manual_seed(seed)
    inputs = problem.make_inputs(device="cpu", scale=scale)
    out, lse = replay(*inputs, seed=seed, **kw)
    ref = problem.reference(*inputs)
    anchor = problem.reference(*numerics.fp64(inputs))
    f = numerics.factor(problem)
    return numerics.ratio("out", out, ref[0], anchor[0], f), numerics.ratio("lse", lse, ref[1], anchor[1], f)


@pytest.mark.parametrize("mode", ["rn", "rz"])
def test_smoke_replay_within_tolerance(mode):
    for seed in range(3):
        r_out, r_lse = ratios("smoke", seed, mode=mode, noise=True)
        assert r_out < 0.5 and r_lse < 0.7


@pytest.mark.skipif(not os.environ.get("P16_FULL_REPLAY"), reason="full scale takes minutes: P16_FULL_REPLAY=1")
def test_full_replay_within_tolerance():
    r_out, r_lse = ratios("full", 1, mode="rz", noise=True)
    assert r_out < 0.5 and r_lse < 0.7


def test_tirx_fragment_plumbing_matches_ptx_semantics():
    """The TIRx kernel's Q word loads, ldmatrix lane addresses (K plain, V .trans), register order into mma
    m16n8k16 and P packing, run lane by lane under the PTX fragment layouts: S = Q K^T and O = S V per warp."""
    import numpy as np
    rng = np.random.default_rng(0)
    BN, DQK, DV, KP, VP = 64, 192, 128, 200, 136
    Q = rng.standard_normal((64, DQK)); K = rng.standard_normal((BN, DQK)); V = rng.standard_normal((BN, DV))
    Ks = np.zeros((BN, KP)); Ks[:, :DQK] = K
    Vs = np.zeros((BN, VP)); Vs[:, :DV] = V

    def ldmatrix(smem, addr_of_lane, trans):
        """addr_of_lane(l) -> (row, col) of the 8 contiguous elements lane l points at; returns regs[t][i] = 2 elems."""
        rows = [[addr_of_lane(8 * i + j) for j in range(8)] for i in range(4)]
        mats = [np.array([smem[r, c:c + 8] for (r, c) in rows[i]]) for i in range(4)]
        regs = [[None] * 4 for _ in range(32)]
        for t in range(32):
            for i in range(4):
                M = mats[i].T if trans else mats[i]
                regs[t][i] = (M[t // 4, 2 * (t % 4)], M[t // 4, 2 * (t % 4) + 1])
        return regs

    def mma(a, b, c):
        """a[t] = 4 pairs, b[t] = 2 pairs, c[t] = 4 floats -> d[t]."""
        A = np.zeros((16, 16)); B = np.zeros((16, 8)); C = np.zeros((16, 8))
        for t in range(32):
            g, tq = t // 4, t % 4
            A[g, 2*tq:2*tq+2] = a[t][0]; A[g+8, 2*tq:2*tq+2] = a[t][1]
            A[g, 2*tq+8:2*tq+10] = a[t][2]; A[g+8, 2*tq+8:2*tq+10] = a[t][3]
            B[2*tq:2*tq+2, g] = b[t][0]; B[2*tq+8:2*tq+10, g] = b[t][1]
            C[g, 2*tq:2*tq+2] = c[t][0:2]; C[g+8, 2*tq:2*tq+2] = c[t][2:4]
        D = C + A @ B
        return [[D[t//4, 2*(t%4)], D[t//4, 2*(t%4)+1], D[t//4+8, 2*(t%4)], D[t//4+8, 2*(t%4)+1]] for t in range(32)]

    for w in range(4):
        # Q A-fragments as the TIRx kernel loads them (uint32 word index kk*8 + tq -> cols 2*(kk*8+tq)..)
        def qa(t, kk):
            g, tq = (t % 32) // 4, t % 4
            r_lo, r_hi = 16 * w + g, 16 * w + g + 8
            word = lambda r, wi: (Q[r, 2 * wi], Q[r, 2 * wi + 1])
            return [word(r_lo, kk*8+tq), word(r_hi, kk*8+tq), word(r_lo, kk*8+4+tq), word(r_hi, kk*8+4+tq)]
        s = [[0.0] * 32 for _ in range(32)]           # s[t][nt*4+e]
        for kk in range(DQK // 16):
            for np_ in range(BN // 16):
                regs = ldmatrix(Ks, lambda l: (np_*16 + (l // 16) * 8 + l % 8, kk*16 + ((l % 16) // 8) * 8), False)
                a = [qa(t, kk) for t in range(32)]
                d0 = mma(a, [(regs[t][0], regs[t][1]) for t in range(32)], [s[t][np_*8:np_*8+4] for t in range(32)])
                d1 = mma(a, [(regs[t][2], regs[t][3]) for t in range(32)], [s[t][np_*8+4:np_*8+8] for t in range(32)])
                for t in range(32):
                    s[t][np_*8:np_*8+4] = d0[t]; s[t][np_*8+4:np_*8+8] = d1[t]
        S = Q[16*w:16*w+16] @ K.T
        for t in range(32):
            g, tq = t // 4, t % 4
            for nt in range(8):
                for e in range(4):
                    assert abs(s[t][nt*4+e] - S[g + 8*(e//2), nt*8 + 2*tq + e % 2]) < 1e-9
        # P = S (any values), O = P V via the kernel's pa packing and ldmatrix.trans
        o = [[0.0] * 64 for _ in range(32)]
        for kk in range(BN // 16):
            pa = [[(s[t][kk*8+0], s[t][kk*8+1]), (s[t][kk*8+2], s[t][kk*8+3]), (s[t][kk*8+4], s[t][kk*8+5]),
                   (s[t][kk*8+6], s[t][kk*8+7])] for t in range(32)]
            for np_ in range(DV // 16):
                regs = ldmatrix(Vs, lambda l: (kk*16 + ((l % 16) // 8) * 8 + l % 8, np_*16 + (l // 16) * 8), True)
                d0 = mma(pa, [(regs[t][0], regs[t][1]) for t in range(32)], [o[t][np_*8:np_*8+4] for t in range(32)])
                d1 = mma(pa, [(regs[t][2], regs[t][3]) for t in range(32)], [o[t][np_*8+4:np_*8+8] for t in range(32)])
                for t in range(32):
                    o[t][np_*8:np_*8+4] = d0[t]; o[t][np_*8+4:np_*8+8] = d1[t]
        O = S @ V
        for t in range(32):
            g, tq = t // 4, t % 4
            for nt in range(16):
                for e in range(4):
                    assert abs(o[t][nt*4+e] - O[g + 8*(e//2), nt*8 + 2*tq + e % 2]) < 1e-8, (w, t, nt, e)
        pass


if __name__ == "__main__":
    import sys
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    for kc, mode, noise in [(4, "rz", True), (12, "rz", True), (4, "rn", True), (12, "rn", False), (2, "rz", True)]:
        print(kc, mode, noise, ratios("full", seed, kc=kc, mode=mode, noise=noise), flush=True)
