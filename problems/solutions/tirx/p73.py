"""p73 gated DeltaNet multi-token (MTP) step over a pooled state (Qwen3-Next) in TIRx: one fused, coalesced pass.

The pool is stored [slot, V, K] per value head (key dim last): row j (value j) is the key vector S[:, j], and the
update is independent per row.  8 lanes share a row, lane l holding the float4s l, l + 8, l + 16, l + 24 of it
(every warp-wide 16-byte load or store covers whole 128-byte lines); a warp holds 4 row groups of 4 rows
(64 registers of state), all its loads issued before anything else.  A CTA of 4 warps covers 64 rows of one
(value head, pool slot): 2 x 16 x 49 = 1568 CTAs, one read and one write of the pool, the SOL traffic.  The
second output is the input pool unchanged (a draft verification commits no state): each warp stores its rows
as loaded, before any token touches them, so every slot is copied bit for bit.  Each warp then finds the
requests that own its slot (a ballot over 32 indices at a time; distinct by construction: a repeated slot
would chain its requests in request order, where the reference starts each from the input pool) and runs
their draft tokens on the rows in registers, for o only: S' = alpha S, k.S' and q.S_new as 4 per-component FMA
partial sums per lane, (p0 + p1) + (p2 + p3), then a butterfly over the row's 8 lanes (xor 1, 2, 4);
delta = (v - k.S') beta; S_new = S' + k delta; o = (q.S_new) scale; the final states are dropped.  The per-token gates
alpha = exp(-exp(A_log) softplus(a + dt_bias)) and beta = sigmoid(b) are evaluated in fp64 (exact libm,
unaffected by fast math) by lanes 0 .. 2T - 1 of each warp (one gate each), rounded once, and broadcast by
shuffles: no shared memory, no CTA barrier.  The next token's q, k, v are loaded a token ahead.
"""
import torch  # before tvm, so TVM's CUDA runtime finds the already-loaded CUDA libraries

import tvm
from tvm.script import tirx as T

WARPS = 4
G = 4                   # row groups per warp, loaded together
FULL = 0xFFFFFFFF


def _make(HK: int, HV: int, DK: int, STEPS: int, SCALE: float):
    REP = HV // HK
    L = min(8, DK // 4)                 # lanes per row
    M = DK // (4 * L)                   # float4s per lane
    RG = 32 // L                        # rows per row group (a warp-wide instruction)
    ROWS = WARPS * G * RG               # rows per CTA
    NB = (DK + ROWS - 1) // ROWS        # row blocks per (slot, head); DV == DK
    NX = L.bit_length() - 1              # butterfly steps (xor 1, 2, 4)
    assert DK % (4 * L) == 0 and 32 % L == 0 and 2 * STEPS <= 32

    def dot(x, S, gi):
        """sum_i x_i S_i over a row: per-component partial sums over the lane's float4s (the row's lanes after)."""
        part = [x[e] * S[gi * M * 4 + e] for e in range(4)]
        for m in range(1, M):
            part = [part[e] + x[m * 4 + e] * S[(gi * M + m) * 4 + e] for e in range(4)]
        return (part[0] + part[1]) + (part[2] + part[3])

    @T.prim_func
    def gdn_mtp(q_h: T.handle, k_h: T.handle, v_h: T.handle, sin_h: T.handle, idx_h: T.handle, alog_h: T.handle,
                a_h: T.handle, dtb_h: T.handle, b_h: T.handle, o_h: T.handle, sout_h: T.handle):
        nb = T.int32()
        npool = T.int32()
        Q = T.match_buffer(q_h, (nb, STEPS, HK, DK), "bfloat16", align=16)
        K = T.match_buffer(k_h, (nb, STEPS, HK, DK), "bfloat16", align=16)
        V = T.match_buffer(v_h, (nb, STEPS, HV, DK), "bfloat16")
        SIN = T.match_buffer(sin_h, (npool, HV, DK, DK), "float32", align=16)
        IDX = T.match_buffer(idx_h, (nb,), "int32")
        ALOG = T.match_buffer(alog_h, (HV,), "float32")
        A = T.match_buffer(a_h, (nb, STEPS, HV), "bfloat16")
        DTB = T.match_buffer(dtb_h, (HV,), "float32")
        B = T.match_buffer(b_h, (nb, STEPS, HV), "bfloat16")
        O = T.match_buffer(o_h, (nb, STEPS, HV, DK), "bfloat16")
        SOUT = T.match_buffer(sout_h, (npool, HV, DK, DK), "float32", align=16)
        T.device_entry()
        rb, h, p = T.cta_id([NB, HV, npool])
        tx = T.thread_id([32 * WARPS])
        S = T.alloc_local((G * M * 4,), "float32")
        kb = T.alloc_local((M * 4,), "bfloat16")     # this token's q, k slices (bf16) ...
        qb = T.alloc_local((M * 4,), "bfloat16")
        vb = T.alloc_local((G,), "bfloat16")
        kn = T.alloc_local((M * 4,), "bfloat16")     # ... and the next token's
        qn = T.alloc_local((M * 4,), "bfloat16")
        vn = T.alloc_local((G,), "bfloat16")
        kf = T.alloc_local((M * 4,), "float32")
        qf = T.alloc_local((M * 4,), "float32")
        sc = T.alloc_local((4,), "float32")          # k.S', delta, q.S_new, gate of this lane
        ii = T.alloc_local((4,), "int32")            # first row of the lane, request, owner flag, next token
        mask = T.alloc_local((1,), "uint32")
        c0 = T.meta_var(4 * (tx % L))               # the lane's first column (a multiple of 4: float4 access)
        ii[0] = rb * ROWS + (tx // 32) * (G * RG) + (tx % 32) // L
        for gi in T.unroll(G):                       # every state load first
            for m in T.unroll(M):
                T.tile.copy(S[(gi * M + m) * 4:(gi * M + m) * 4 + 4],
                            SIN[p, h, T.min(ii[0] + gi * RG, DK - 1), c0 + 4 * L * m:c0 + 4 * L * m + 4])
        for gi in T.unroll(G):                       # the output pool: the rows as loaded (a clamped row twice)
            for m in T.unroll(M):
                T.tile.copy(SOUT[p, h, T.min(ii[0] + gi * RG, DK - 1), c0 + 4 * L * m:c0 + 4 * L * m + 4],
                            S[(gi * M + m) * 4:(gi * M + m) * 4 + 4])
        for c in T.serial((nb + 31) // 32):          # the requests that own this slot, in order
            ii[2] = 0
            if c * 32 + tx % 32 < nb:
                if IDX[c * 32 + tx % 32] == p:
                    ii[2] = 1
            mask[0] = T.cuda.ballot_sync(T.uint32(FULL), ii[2] == 1)
            for bit in T.serial(32):
                if T.bitwise_and(T.shift_right(mask[0], T.Cast("uint32", bit)), T.uint32(1)) == T.uint32(1):
                    ii[1] = c * 32 + bit
                    # lane t < T: alpha of token t; lane T + t: beta of token t (fp64, rounded once)
                    x: T.float64 = (T.Cast("float64", T.Cast("float32", A[ii[1], tx % 32 % STEPS, h]))
                                    + T.Cast("float64", DTB[h]))
                    sp: T.float64 = T.if_then_else(x > T.float64(20), x, T.log1p(T.exp(x)))
                    sc[3] = T.Cast("float32", T.exp(-T.exp(T.Cast("float64", ALOG[h])) * sp))
                    if tx % 32 >= STEPS:
                        sc[3] = T.Cast("float32", T.float64(1) / (T.float64(1) + T.exp(
                            -T.Cast("float64", T.Cast("float32", B[ii[1], tx % 32 % STEPS, h])))))
                    for m in T.unroll(M):
                        T.tile.copy(kb[m * 4:m * 4 + 4], K[ii[1], 0, h // REP, c0 + 4 * L * m:c0 + 4 * L * m + 4])
                        T.tile.copy(qb[m * 4:m * 4 + 4], Q[ii[1], 0, h // REP, c0 + 4 * L * m:c0 + 4 * L * m + 4])
                    for gi in T.unroll(G):
                        vb[gi] = V[ii[1], 0, h, T.min(ii[0] + gi * RG, DK - 1)]
                    for t in T.serial(STEPS):
                        decay: T.float32 = T.tvm_warp_shuffle(T.uint32(FULL), sc[3], t, 32, 32)
                        beta: T.float32 = T.tvm_warp_shuffle(T.uint32(FULL), sc[3], STEPS + t, 32, 32)
                        ii[3] = T.min(t + 1, STEPS - 1)
                        for m in T.unroll(M):
                            T.tile.copy(kn[m * 4:m * 4 + 4],
                                        K[ii[1], ii[3], h // REP, c0 + 4 * L * m:c0 + 4 * L * m + 4])
                            T.tile.copy(qn[m * 4:m * 4 + 4],
                                        Q[ii[1], ii[3], h // REP, c0 + 4 * L * m:c0 + 4 * L * m + 4])
                        for gi in T.unroll(G):
                            vn[gi] = V[ii[1], ii[3], h, T.min(ii[0] + gi * RG, DK - 1)]
                        for i in T.unroll(M * 4):
                            kf[i] = T.Cast("float32", kb[i])
                            qf[i] = T.Cast("float32", qb[i])
                        for gi in T.unroll(G):
                            for i in T.unroll(M * 4):
                                S[gi * M * 4 + i] = S[gi * M * 4 + i] * decay
                            sc[0] = dot(kf, S, gi)
                            for i in T.unroll(NX):
                                sc[0] = sc[0] + T.tvm_warp_shuffle_xor(T.uint32(FULL), sc[0], T.shift_left(1, i), 32, 32)
                            sc[1] = (T.Cast("float32", vb[gi]) - sc[0]) * beta
                            for i in T.unroll(M * 4):
                                S[gi * M * 4 + i] = S[gi * M * 4 + i] + kf[i] * sc[1]
                            sc[2] = dot(qf, S, gi)
                            for i in T.unroll(NX):
                                sc[2] = sc[2] + T.tvm_warp_shuffle_xor(T.uint32(FULL), sc[2], T.shift_left(1, i), 32, 32)
                            if ii[0] + gi * RG < DK and tx % L == 0:
                                O[ii[1], t, h, ii[0] + gi * RG] = T.Cast("bfloat16", sc[2] * T.float32(SCALE))
                        for i in T.unroll(M * 4):
                            kb[i] = kn[i]
                            qb[i] = qn[i]
                        for gi in T.unroll(G):
                            vb[gi] = vn[gi]

    return gdn_mtp


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _build(func, arch):
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    with target:
        return tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")


def _prepare(q, k, v, state_pool, indices, A_log, a, dt_bias, b, scale, arch=None):
    key = (q.shape[2], v.shape[2], q.shape[3], q.shape[1], float(scale))
    if key not in _COMPILED:
        assert q.shape[3] == v.shape[3] == state_pool.shape[3] == state_pool.shape[2]
        assert indices.dtype == torch.int32 and all(t.is_contiguous() for t in (q, k, v, state_pool, indices, a, b))
        _COMPILED[key] = _build(_make(*key), arch or _arch())
    return [_COMPILED[key]]


def solve(q, k, v, state_pool, indices, A_log, a, dt_bias, b, scale):
    (exe,) = _prepare(q, k, v, state_pool, indices, A_log, a, dt_bias, b, scale)
    o = torch.empty_like(v)
    s_out = torch.empty_like(state_pool)
    exe(q, k, v, state_pool, indices, A_log, a, dt_bias, b, o, s_out)
    return o, s_out
