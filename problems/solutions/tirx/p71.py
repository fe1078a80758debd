"""p71 gated DeltaNet varlen prefill from per-sequence states (Qwen3-Next) in TIRx, token by token in fp32.

S = state^T [K, V] per (sequence, v head); per token: S' = alpha S, u = k.S', S = S' + k (beta (v - u))^T,
o = scale * q.S (q, k used as given; v head h reads q/k head h // (Hv/Hk)).  The recurrence is
independent per value column j, and column j of S is row j of the stored [V, K] state (contiguous), so
the state is split over columns as in the shipped p62: a CTA handles 16 columns of one (v head,
sequence), a thread owns DK/8 consecutive rows of one column in registers for the whole sequence (one
vector load of the initial state, one vector store of the final state), and the 8 threads of a column
(adjacent lanes) combine k.S' and q.S with 8-lane warp sums (each thread's part in 4 interleaved
partial sums).  Sequence bounds are read from cu_seqlens (int64) in the kernel; a sequence's tokens run
in order, the next token's q/k/v prefetched into registers.  The gates alpha = exp(-exp(A_log) *
softplus(a + dt_bias)) and beta = sigmoid(b) are evaluated in fp64 (exact libm, unaffected by fast
math) and rounded once, for 128 tokens at a time (thread i: token i) into shared memory.  o is written
per token (bf16).
"""
import torch  # before tvm, so TVM's CUDA runtime finds the already-loaded CUDA libraries

import tvm
from tvm.script import tirx as T

RT = 8                  # threads per column
COLS = 16               # columns per CTA
NT = RT * COLS          # threads per CTA = tokens per gate chunk


def _make(HK: int, HV: int, DK: int, DV: int, SCALE: float):
    assert DK % RT == 0 and DV % COLS == 0
    R = DK // RT
    NP = min(4, R)      # partial sums per thread
    REP = HV // HK

    def combine(part):
        if NP == 4:
            return (part[0] + part[1]) + (part[2] + part[3])
        if NP == 2:
            return part[0] + part[1]
        return part[0]

    @T.prim_func
    def gdn_varlen(q_h: T.handle, k_h: T.handle, v_h: T.handle, sin_h: T.handle, alog_h: T.handle,
                   a_h: T.handle, dtb_h: T.handle, b_h: T.handle, cu_h: T.handle, o_h: T.handle,
                   sout_h: T.handle):
        r1 = T.int32()
        r2 = T.int32()
        r3 = T.int32()
        nb1 = T.int32()
        Q = T.match_buffer(q_h, (r1, DK), "bfloat16", align=16)
        K = T.match_buffer(k_h, (r1, DK), "bfloat16", align=16)
        V = T.match_buffer(v_h, (r2, DV), "bfloat16")
        SIN = T.match_buffer(sin_h, (r3, DK), "float32", align=16)
        ALOG = T.match_buffer(alog_h, (HV,), "float32")
        A = T.match_buffer(a_h, (r2,), "bfloat16")
        DTB = T.match_buffer(dtb_h, (HV,), "float32")
        B = T.match_buffer(b_h, (r2,), "bfloat16")
        CU = T.match_buffer(cu_h, (nb1,), "int64")
        O = T.match_buffer(o_h, (r2, DV), "bfloat16")
        SOUT = T.match_buffer(sout_h, (r3, DK), "float32", align=16)
        T.device_entry()
        cb, h, n = T.cta_id([DV // COLS, HV, nb1 - 1])
        tx = T.thread_id([NT])
        gs = T.alloc_shared((2 * NT,), "float32")   # alpha, beta of the chunk's tokens
        S = T.alloc_local((R,), "float32")
        part = T.alloc_local((NP,), "float32")
        nk = T.alloc_local((R,), "bfloat16")
        nq = T.alloc_local((R,), "bfloat16")
        ck = T.alloc_local((R,), "bfloat16")
        cq = T.alloc_local((R,), "bfloat16")
        sc = T.alloc_local((4,), "float32")         # next v, current v, k.S', q.S
        bnd = T.alloc_local((3,), "int32")          # start, end, state row (loop-invariant)
        rc: T.let = tx % RT
        j: T.let = cb * COLS + tx // RT
        kh: T.let = h // REP
        bnd[0] = T.Cast("int32", CU[n])
        bnd[1] = T.Cast("int32", CU[n + 1])
        bnd[2] = (n * HV + h) * DV + j
        T.tile.copy(S[:], SIN[bnd[2], rc * R:rc * R + R])
        sc[0] = T.float32(0)
        if bnd[0] < bnd[1]:
            T.tile.copy(nk[:], K[bnd[0] * HK + kh, rc * R:rc * R + R])
            T.tile.copy(nq[:], Q[bnd[0] * HK + kh, rc * R:rc * R + R])
            sc[0] = T.Cast("float32", V[bnd[0] * HV + h, j])
        for t in T.serial(bnd[0], bnd[1]):
            if (t - bnd[0]) % NT == 0:               # CTA-uniform: gates of the next NT tokens, thread i: token t + i
                T.cuda.cta_sync()                   # everyone is done with the previous chunk's gates
                if t + tx < bnd[1]:
                    x: T.float64 = T.Cast("float64", T.Cast("float32", A[(t + tx) * HV + h])) + T.Cast(
                        "float64", DTB[h])
                    sp: T.float64 = T.if_then_else(x > T.float64(20), x, T.log1p(T.exp(x)))
                    gs[tx] = T.Cast("float32", T.exp(-T.exp(T.Cast("float64", ALOG[h])) * sp))
                    gs[NT + tx] = T.Cast("float32", T.float64(1) / (
                        T.float64(1) + T.exp(-T.Cast("float64", T.Cast("float32", B[(t + tx) * HV + h])))))
                T.cuda.cta_sync()
            for r in T.unroll(R):
                ck[r] = nk[r]
                cq[r] = nq[r]
            sc[1] = sc[0]
            if t + 1 < bnd[1]:
                T.tile.copy(nk[:], K[(t + 1) * HK + kh, rc * R:rc * R + R])
                T.tile.copy(nq[:], Q[(t + 1) * HK + kh, rc * R:rc * R + R])
                sc[0] = T.Cast("float32", V[(t + 1) * HV + h, j])
            alpha: T.float32 = gs[(t - bnd[0]) % NT]
            beta: T.float32 = gs[NT + (t - bnd[0]) % NT]
            for u in T.unroll(NP):
                part[u] = T.float32(0)
            for r in T.unroll(R):
                S[r] = S[r] * alpha
                part[r % NP] = part[r % NP] + T.Cast("float32", ck[r]) * S[r]
            sc[2] = T.cuda.warp_sum(combine(part), RT)
            delta: T.float32 = (sc[1] - sc[2]) * beta
            for u in T.unroll(NP):
                part[u] = T.float32(0)
            for r in T.unroll(R):
                S[r] = S[r] + T.Cast("float32", ck[r]) * delta
                part[r % NP] = part[r % NP] + T.Cast("float32", cq[r]) * S[r]
            sc[3] = T.cuda.warp_sum(combine(part), RT)
            if rc == 0:
                O[t * HV + h, j] = T.Cast("bfloat16", sc[3] * T.float32(SCALE))
        T.tile.copy(SOUT[bnd[2], rc * R:rc * R + R], S[:])

    return gdn_varlen


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _build(func, arch):
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    with target:
        return tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")


def _prepare(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, arch=None):
    key = (q.shape[1], v.shape[1], q.shape[2], v.shape[2], float(scale))
    assert state.shape[2] == v.shape[2] and state.shape[3] == q.shape[2]
    if key not in _COMPILED:
        _COMPILED[key] = _build(_make(*key), arch or _arch())
    return [_COMPILED[key]]


def solve(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale):
    (exe,) = _prepare(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale)
    dk, dv = q.shape[2], v.shape[2]
    o = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    s_out = torch.empty(state.shape, dtype=state.dtype, device=state.device)
    exe(q.contiguous().view(-1, dk), k.contiguous().view(-1, dk), v.contiguous().view(-1, dv),
        state.contiguous().view(-1, dk), A_log.contiguous(), a.contiguous().view(-1), dt_bias.contiguous(),
        b.contiguous().view(-1), cu_seqlens.contiguous(), o.view(-1, dv), s_out.view(-1, dk))
    return o, s_out
