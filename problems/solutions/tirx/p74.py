"""p74 DeltaNet delta-rule recurrence (T=1024) in TIRx, token by token in fp32.

The recurrence is independent per value column j (S[:, j] only ever sees k, q, beta and v[:, j]), so
the state is split over columns: a CTA handles 16 columns of one (batch, head), a thread owns
DK/8 rows of one column in registers for the whole sequence, and the 8 threads of a column
(adjacent lanes) combine k.S, q.S and the L2 norms with 3-step shuffles.  The next token's q/k/v/beta
are loaded while the current one is processed.  o is written per token (bf16), the state at the end.
"""
import torch  # before tvm, so TVM's CUDA runtime finds the already-loaded CUDA libraries

import tvm
from tvm.script import tirx as T

L2_EPS = 1e-6
RT = 8
COLS = 16


def _make(DK: int, DV: int, SEQ: int):
    R = DK // RT
    QSCALE = DK ** -0.5

    @T.prim_func
    def delta_rule(q_h: T.handle, k_h: T.handle, v_h: T.handle, b_h: T.handle, s0_h: T.handle, o_h: T.handle,
                   s1_h: T.handle):
        r1 = T.int32()
        r2 = T.int32()
        Q = T.match_buffer(q_h, (r1, DK), "bfloat16", align=16)
        K = T.match_buffer(k_h, (r1, DK), "bfloat16", align=16)
        V = T.match_buffer(v_h, (r1, DV), "bfloat16")
        BETA = T.match_buffer(b_h, (r1,), "bfloat16")
        S0 = T.match_buffer(s0_h, (r2, DV), "float32")
        O = T.match_buffer(o_h, (r1, DV), "bfloat16")
        S1 = T.match_buffer(s1_h, (r2, DV), "float32")
        T.device_entry()
        cb, bh = T.cta_id([DV // COLS, r2 // DK])
        tx = T.thread_id([RT * COLS])
        S = T.alloc_local((R,), "float32")
        nk = T.alloc_local((R,), "bfloat16")
        nq = T.alloc_local((R,), "bfloat16")
        ck = T.alloc_local((R,), "bfloat16")
        cq = T.alloc_local((R,), "bfloat16")
        kn = T.alloc_local((R,), "float32")
        sc = T.alloc_local((8,), "float32")     # next v, next beta, cur v, cur beta, sk, sq, kS, o
        rc: T.let = tx % RT
        j: T.let = cb * COLS + tx // RT
        row0: T.let = bh * SEQ
        for r in T.unroll(R):
            S[r] = S0[bh * DK + rc * R + r, j]
        T.tile.copy(nk[:], K[row0, rc * R:rc * R + R])
        T.tile.copy(nq[:], Q[row0, rc * R:rc * R + R])
        sc[0] = T.Cast("float32", V[row0, j])
        sc[1] = T.Cast("float32", BETA[row0])
        for t in T.serial(SEQ):
            for r in T.unroll(R):
                ck[r] = nk[r]
                cq[r] = nq[r]
            sc[2] = sc[0]
            sc[3] = sc[1]
            if t + 1 < SEQ:
                T.tile.copy(nk[:], K[row0 + t + 1, rc * R:rc * R + R])
                T.tile.copy(nq[:], Q[row0 + t + 1, rc * R:rc * R + R])
                sc[0] = T.Cast("float32", V[row0 + t + 1, j])
                sc[1] = T.Cast("float32", BETA[row0 + t + 1])
            sc[4] = T.float32(0)
            sc[5] = T.float32(0)
            for r in T.unroll(R):
                sc[4] = sc[4] + T.Cast("float32", ck[r]) * T.Cast("float32", ck[r])
                sc[5] = sc[5] + T.Cast("float32", cq[r]) * T.Cast("float32", cq[r])
            sk: T.float32 = T.cuda.warp_sum(sc[4], RT)
            sq: T.float32 = T.cuda.warp_sum(sc[5], RT)
            rk: T.float32 = T.rsqrt(sk + T.float32(L2_EPS))
            rq: T.float32 = T.rsqrt(sq + T.float32(L2_EPS))
            sc[6] = T.float32(0)
            for r in T.unroll(R):
                kn[r] = T.Cast("float32", ck[r]) * rk
                sc[6] = sc[6] + kn[r] * S[r]
            kS: T.float32 = T.cuda.warp_sum(sc[6], RT)
            delta: T.float32 = (sc[2] - kS) * sc[3]
            sc[7] = T.float32(0)
            for r in T.unroll(R):
                S[r] = S[r] + kn[r] * delta
                sc[7] = sc[7] + (T.Cast("float32", cq[r]) * rq * T.float32(QSCALE)) * S[r]
            ot: T.float32 = T.cuda.warp_sum(sc[7], RT)
            if rc == 0:
                O[row0 + t, j] = T.Cast("bfloat16", ot)
        for r in T.unroll(R):
            S1[bh * DK + rc * R + r, j] = S[r]

    return delta_rule


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _build(func, arch):
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    with target:
        return tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")


def _prepare(q, k, v, beta, initial_state, arch=None):
    key = (q.shape[3], v.shape[3], q.shape[2])
    if key not in _COMPILED:
        assert key[0] % RT == 0 and key[1] % COLS == 0
        _COMPILED[key] = _build(_make(*key), arch or _arch())
    return [_COMPILED[key]]


def solve(q, k, v, beta, initial_state):
    (exe,) = _prepare(q, k, v, beta, initial_state)
    batch, heads, seq, dk = q.shape
    dv = v.shape[3]
    o = torch.empty(batch, heads, seq, dv, dtype=q.dtype, device=q.device)
    s1 = torch.empty(initial_state.shape, dtype=initial_state.dtype, device=q.device)
    exe(q.contiguous().view(-1, dk), k.contiguous().view(-1, dk), v.contiguous().view(-1, dv),
        beta.contiguous().view(-1), initial_state.contiguous().view(-1, dv), o.view(-1, dv), s1.view(-1, dv))
    return o, s1
