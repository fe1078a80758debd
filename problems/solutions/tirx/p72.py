"""p72 gated DeltaNet decode step (Qwen3-Next) in TIRx: one fused, coalesced, memory-bound state update.

The state is stored [V, K] (key dim last): row j (value j) is the key vector S[:, j], and the update is
independent per row.  8 lanes share a row, lane l holding the float4s l, l + 8, l + 16, l + 24 of it
(every warp-wide 16-byte load or store covers whole 128-byte lines); a warp holds 4 row groups of 4 rows
(64 registers of state), its loads all issued before any arithmetic.  Per row: S' = alpha S,
k.S' and q.S_new as 4 per-component FMA partial sums per lane, (p0 + p1) + (p2 + p3), then a butterfly over
the row's 8 lanes (xor 1, 2, 4); delta = (v - k.S') beta; S_new = S' + k delta; o = (q.S_new) scale.
A CTA of 4 warps handles 64 rows of one (value head, sequence): 2048 CTAs of 128 threads.  One read and
one write of the state, the SOL traffic.  q and k are used as given; the per-head gate scalars
alpha = exp(-exp(A_log) softplus(a + dt_bias)) and beta = sigmoid(b) are evaluated in fp64 (exact libm,
unaffected by fast math) and rounded once.
"""
import torch  # before tvm, so TVM's CUDA runtime finds the already-loaded CUDA libraries

import tvm
from tvm.script import tirx as T

WARPS = 4
G = 4                   # row groups per warp, loaded together


def _make(HK: int, HV: int, DK: int, SCALE: float):
    REP = HV // HK
    L = min(8, DK // 4)                 # lanes per row
    M = DK // (4 * L)                   # float4s per lane
    RG = 32 // L                        # rows per row group (a warp-wide instruction)
    ROWS = WARPS * G * RG               # rows per CTA
    NB = (DK + ROWS - 1) // ROWS        # row blocks per (sequence, head); DV == DK
    NX = L.bit_length() - 1              # butterfly steps (xor 1, 2, 4)
    assert DK % (4 * L) == 0 and 32 % L == 0

    def dot(x, S, gi):
        """sum_i x_i S_i over a row: per-component partial sums over the lane's float4s, then the row's lanes."""
        part = [x[e] * S[gi * M * 4 + e] for e in range(4)]
        for m in range(1, M):
            part = [part[e] + x[m * 4 + e] * S[(gi * M + m) * 4 + e] for e in range(4)]
        return (part[0] + part[1]) + (part[2] + part[3])

    @T.prim_func
    def gdn_decode(q_h: T.handle, k_h: T.handle, v_h: T.handle, a_h: T.handle, b_h: T.handle, alog_h: T.handle,
                   dtb_h: T.handle, sin_h: T.handle, o_h: T.handle, sout_h: T.handle):
        r1 = T.int32()
        r2 = T.int32()
        r3 = T.int32()
        Q = T.match_buffer(q_h, (r1, DK), "bfloat16", align=16)
        K = T.match_buffer(k_h, (r1, DK), "bfloat16", align=16)
        V = T.match_buffer(v_h, (r2, DK), "bfloat16")
        A = T.match_buffer(a_h, (r2,), "bfloat16")
        B = T.match_buffer(b_h, (r2,), "bfloat16")
        ALOG = T.match_buffer(alog_h, (HV,), "float32")
        DTB = T.match_buffer(dtb_h, (HV,), "float32")
        SIN = T.match_buffer(sin_h, (r3, DK), "float32", align=16)
        O = T.match_buffer(o_h, (r2, DK), "bfloat16")
        SOUT = T.match_buffer(sout_h, (r3, DK), "float32", align=16)
        T.device_entry()
        h, bi, rb = T.cta_id([HV, r2 // HV, NB])
        tx = T.thread_id([32 * WARPS])
        S = T.alloc_local((G * M * 4,), "float32")
        kb = T.alloc_local((M * 4,), "bfloat16")
        qb = T.alloc_local((M * 4,), "bfloat16")
        kf = T.alloc_local((M * 4,), "float32")
        qf = T.alloc_local((M * 4,), "float32")
        sc = T.alloc_local((4,), "float32")        # k.S', delta, q.S_new
        idx = T.alloc_local((3,), "int32")         # first row of the lane, (sequence, head), q/k row
        c0 = T.meta_var(4 * (tx % L))             # the lane's first column (a multiple of 4: float4 access)
        idx[0] = rb * ROWS + (tx // 32) * (G * RG) + (tx % 32) // L
        idx[1] = bi * HV + h
        idx[2] = bi * HK + h // REP
        for gi in T.unroll(G):                     # every state load first
            for m in T.unroll(M):
                T.tile.copy(S[(gi * M + m) * 4:(gi * M + m) * 4 + 4],
                            SIN[idx[1] * DK + T.min(idx[0] + gi * RG, DK - 1),
                                c0 + 4 * L * m:c0 + 4 * L * m + 4])
        for m in T.unroll(M):
            T.tile.copy(kb[m * 4:m * 4 + 4], K[idx[2], c0 + 4 * L * m:c0 + 4 * L * m + 4])
            T.tile.copy(qb[m * 4:m * 4 + 4], Q[idx[2], c0 + 4 * L * m:c0 + 4 * L * m + 4])
        for i in T.unroll(M * 4):
            kf[i] = T.Cast("float32", kb[i])
            qf[i] = T.Cast("float32", qb[i])
        x: T.float64 = T.Cast("float64", T.Cast("float32", A[idx[1]])) + T.Cast("float64", DTB[h])
        sp: T.float64 = T.if_then_else(x > T.float64(20), x, T.log1p(T.exp(x)))
        decay: T.float32 = T.Cast("float32", T.exp(-T.exp(T.Cast("float64", ALOG[h])) * sp))
        beta: T.float32 = T.Cast("float32", T.float64(1) / (T.float64(1) + T.exp(-T.Cast("float64", T.Cast("float32", B[idx[1]])))))
        for gi in T.unroll(G):
            for i in T.unroll(M * 4):
                S[gi * M * 4 + i] = S[gi * M * 4 + i] * decay
            sc[0] = dot(kf, S, gi)
            for i in T.unroll(NX):
                sc[0] = sc[0] + T.tvm_warp_shuffle_xor(T.uint32(0xFFFFFFFF), sc[0], T.shift_left(1, i), 32, 32)
            sc[1] = (T.Cast("float32", V[idx[1], T.min(idx[0] + gi * RG, DK - 1)]) - sc[0]) * beta
            for i in T.unroll(M * 4):
                S[gi * M * 4 + i] = S[gi * M * 4 + i] + kf[i] * sc[1]
            sc[2] = dot(qf, S, gi)
            for i in T.unroll(NX):
                sc[2] = sc[2] + T.tvm_warp_shuffle_xor(T.uint32(0xFFFFFFFF), sc[2], T.shift_left(1, i), 32, 32)
            if idx[0] + gi * RG < DK:
                for m in T.unroll(M):
                    T.tile.copy(SOUT[idx[1] * DK + idx[0] + gi * RG,
                                     c0 + 4 * L * m:c0 + 4 * L * m + 4],
                                S[(gi * M + m) * 4:(gi * M + m) * 4 + 4])
                if tx % L == 0:
                    O[idx[1], idx[0] + gi * RG] = T.Cast("bfloat16", sc[2] * T.float32(SCALE))

    return gdn_decode


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _build(func, arch):
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    with target:
        return tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")


def _prepare(q, k, v, state, A_log, a, dt_bias, b, scale, arch=None):
    key = (q.shape[2], v.shape[2], q.shape[3], float(scale))
    assert q.shape[3] == v.shape[3] == state.shape[2] == state.shape[3]
    if key not in _COMPILED:
        _COMPILED[key] = _build(_make(*key), arch or _arch())
    return [_COMPILED[key]]


def solve(q, k, v, state, A_log, a, dt_bias, b, scale):
    (exe,) = _prepare(q, k, v, state, A_log, a, dt_bias, b, scale)
    batch, _, hk, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    o = torch.empty(batch, 1, hv, dv, dtype=q.dtype, device=q.device)
    s_out = torch.empty(state.shape, dtype=state.dtype, device=state.device)
    exe(q.contiguous().view(-1, dk), k.contiguous().view(-1, dk), v.contiguous().view(-1, dv),
        a.contiguous().view(-1), b.contiguous().view(-1), A_log.contiguous(), dt_bias.contiguous(),
        state.contiguous().view(-1, dk), o.view(-1, dv), s_out.view(-1, dk))
    return o, s_out
