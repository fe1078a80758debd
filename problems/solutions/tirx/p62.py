"""p62 chunked gated delta rule (Gated DeltaNet prefill, Qwen3-Next) in TIRx, token by token in fp32.

The reference evaluates the recurrence in chunks of 64 (WY / UT form); the answer is the recurrence
S_t = a_t S_{t-1} + b_t k_t (v_t - a_t S_{t-1}^T k_t)^T, o_t = S_t^T (scale q_t) from a zero state,
with q and k L2-normalised in the kernel.  It is independent per value column j, so the state is
split over columns: a CTA handles 16 columns of one (sequence, v head), a thread owns DK/8 rows of
one column in registers for the whole sequence, and the 8 threads of a column (adjacent lanes)
combine k.S, q.S and the L2 norms with 3-step shuffles.  The v head reads q/k head h // (Hv/Hk).
The next token's q/k/v/g/beta are loaded while the current one is processed; a_t = exp(g_t) is
evaluated in fp64 (exact libm, unaffected by fast math) and rounded once.  o is written per token
(bf16).
"""
import torch  # before tvm, so TVM's CUDA runtime finds the already-loaded CUDA libraries

import tvm
from tvm.script import tirx as T

L2_EPS = 1e-6
RT = 8
COLS = 16


def _make(HK: int, HV: int, DK: int, DV: int, SEQ: int, SCALE: float):
    R = DK // RT
    REP = HV // HK

    @T.prim_func
    def gated_delta_rule(q_h: T.handle, k_h: T.handle, v_h: T.handle, g_h: T.handle, b_h: T.handle,
                         o_h: T.handle):
        r1 = T.int32()
        r2 = T.int32()
        Q = T.match_buffer(q_h, (r1, DK), "bfloat16", align=16)
        K = T.match_buffer(k_h, (r1, DK), "bfloat16", align=16)
        V = T.match_buffer(v_h, (r2, DV), "bfloat16")
        G = T.match_buffer(g_h, (r2,), "bfloat16")
        BETA = T.match_buffer(b_h, (r2,), "bfloat16")
        O = T.match_buffer(o_h, (r2, DV), "bfloat16")
        T.device_entry()
        cb, bh = T.cta_id([DV // COLS, r2 // SEQ])
        tx = T.thread_id([RT * COLS])
        S = T.alloc_local((R,), "float32")
        nk = T.alloc_local((R,), "bfloat16")
        nq = T.alloc_local((R,), "bfloat16")
        ck = T.alloc_local((R,), "bfloat16")
        cq = T.alloc_local((R,), "bfloat16")
        kn = T.alloc_local((R,), "float32")
        sc = T.alloc_local((10,), "float32")    # next v, g, beta; current v, g, beta; sk, sq, kS, o
        base = T.alloc_local((2,), "int32")     # first q/k row, first v row (loop-invariant)
        rc: T.let = tx % RT
        j: T.let = cb * COLS + tx // RT
        base[0] = ((bh // HV) * HK + (bh % HV) // REP) * SEQ
        base[1] = bh * SEQ
        for r in T.unroll(R):
            S[r] = T.float32(0)
        T.tile.copy(nk[:], K[base[0], rc * R:rc * R + R])
        T.tile.copy(nq[:], Q[base[0], rc * R:rc * R + R])
        sc[0] = T.Cast("float32", V[base[1], j])
        sc[1] = T.Cast("float32", G[base[1]])
        sc[2] = T.Cast("float32", BETA[base[1]])
        for t in T.serial(SEQ):
            for r in T.unroll(R):
                ck[r] = nk[r]
                cq[r] = nq[r]
            sc[3] = sc[0]
            sc[4] = sc[1]
            sc[5] = sc[2]
            if t + 1 < SEQ:
                T.tile.copy(nk[:], K[base[0] + t + 1, rc * R:rc * R + R])
                T.tile.copy(nq[:], Q[base[0] + t + 1, rc * R:rc * R + R])
                sc[0] = T.Cast("float32", V[base[1] + t + 1, j])
                sc[1] = T.Cast("float32", G[base[1] + t + 1])
                sc[2] = T.Cast("float32", BETA[base[1] + t + 1])
            alpha: T.float32 = T.Cast("float32", T.exp(T.Cast("float64", sc[4])))
            sc[6] = T.float32(0)
            sc[7] = T.float32(0)
            for r in T.unroll(R):
                sc[6] = sc[6] + T.Cast("float32", ck[r]) * T.Cast("float32", ck[r])
                sc[7] = sc[7] + T.Cast("float32", cq[r]) * T.Cast("float32", cq[r])
            sk: T.float32 = T.cuda.warp_sum(sc[6], RT)
            sq: T.float32 = T.cuda.warp_sum(sc[7], RT)
            rk: T.float32 = T.rsqrt(sk + T.float32(L2_EPS))
            rq: T.float32 = T.rsqrt(sq + T.float32(L2_EPS))
            sc[8] = T.float32(0)
            for r in T.unroll(R):
                kn[r] = T.Cast("float32", ck[r]) * rk
                S[r] = S[r] * alpha
                sc[8] = sc[8] + kn[r] * S[r]
            kS: T.float32 = T.cuda.warp_sum(sc[8], RT)
            delta: T.float32 = (sc[3] - kS) * sc[5]
            sc[9] = T.float32(0)
            for r in T.unroll(R):
                S[r] = S[r] + kn[r] * delta
                sc[9] = sc[9] + (T.Cast("float32", cq[r]) * rq * T.float32(SCALE)) * S[r]
            ot: T.float32 = T.cuda.warp_sum(sc[9], RT)
            if rc == 0:
                O[base[1] + t, j] = T.Cast("bfloat16", ot)

    return gated_delta_rule


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _build(func, arch):
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    with target:
        return tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")


def _prepare(q, k, v, g, beta, scale, arch=None):
    key = (q.shape[1], v.shape[1], q.shape[3], v.shape[3], q.shape[2], float(scale))
    if key not in _COMPILED:
        assert key[2] % RT == 0 and key[3] % COLS == 0
        _COMPILED[key] = _build(_make(*key), arch or _arch())
    return [_COMPILED[key]]


def solve(q, k, v, g, beta, scale):
    (exe,) = _prepare(q, k, v, g, beta, scale)
    dk, dv = q.shape[3], v.shape[3]
    o = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    exe(q.contiguous().view(-1, dk), k.contiguous().view(-1, dk), v.contiguous().view(-1, dv),
        g.contiguous().view(-1), beta.contiguous().view(-1), o.view(-1, dv))
    return o
