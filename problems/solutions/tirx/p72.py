"""p72 gated DeltaNet decode step (Qwen3-Next) in TIRx: one fused, memory-bound state update.

A CTA per (value head, sequence), a thread per value index j: the state is stored [V, K] (key dim
last), so the thread streams its row S^T[j, :] (the key vector of value j) of the fp32 state into
registers once, decays it, forms k.S[:, j], the delta-rule update and o_j = scale * q.S_new[:, j], and
writes the new row: one read and one write of the state, the SOL traffic.  q and k are used as given
(no normalisation); the per-head scalars alpha = exp(g) and beta are evaluated in fp64 (exact libm,
unaffected by fast math) and rounded once.
"""
import torch  # before tvm, so TVM's CUDA runtime finds the already-loaded CUDA libraries

import tvm
from tvm.script import tirx as T


def _make(HK: int, HV: int, DK: int, SCALE: float):
    REP = HV // HK
    W = (DK + 31) // 32
    NT = 32 * W

    @T.prim_func
    def gdn_decode(q_h: T.handle, k_h: T.handle, v_h: T.handle, a_h: T.handle, b_h: T.handle, alog_h: T.handle,
                   dtb_h: T.handle, sin_h: T.handle, o_h: T.handle, sout_h: T.handle):
        r1 = T.int32()
        r2 = T.int32()
        r3 = T.int32()
        Q = T.match_buffer(q_h, (r1, DK), "bfloat16")
        K = T.match_buffer(k_h, (r1, DK), "bfloat16")
        V = T.match_buffer(v_h, (r2, DK), "bfloat16")
        A = T.match_buffer(a_h, (r2,), "bfloat16")
        B = T.match_buffer(b_h, (r2,), "bfloat16")
        ALOG = T.match_buffer(alog_h, (HV,), "float32")
        DTB = T.match_buffer(dtb_h, (HV,), "float32")
        SIN = T.match_buffer(sin_h, (r3, DK), "float32")
        O = T.match_buffer(o_h, (r2, DK), "bfloat16")
        SOUT = T.match_buffer(sout_h, (r3, DK), "float32")
        T.device_entry()
        h, bi = T.cta_id([HV, r2 // HV])
        j = T.thread_id([NT])
        qs = T.alloc_shared((DK,), "float32")
        ks = T.alloc_shared((DK,), "float32")
        col = T.alloc_local((DK,), "float32")
        sc = T.alloc_local((4,), "float32")        # q_j, k_j, kS, o
        bh: T.let = bi * HV + h
        krow: T.let = bi * HK + h // REP
        sc[0] = T.float32(0)
        sc[1] = T.float32(0)
        if j < DK:
            sc[0] = T.Cast("float32", Q[krow, j])
            sc[1] = T.Cast("float32", K[krow, j])
        if j < DK:
            qs[j] = sc[0] * T.float32(SCALE)
            ks[j] = sc[1]
        x: T.float64 = T.Cast("float64", T.Cast("float32", A[bh])) + T.Cast("float64", DTB[h])
        sp: T.float64 = T.if_then_else(x > T.float64(20), x, T.log1p(T.exp(x)))
        decay: T.float32 = T.Cast("float32", T.exp(-T.exp(T.Cast("float64", ALOG[h])) * sp))
        beta: T.float32 = T.Cast("float32", T.float64(1) / (T.float64(1) + T.exp(-T.Cast("float64", T.Cast("float32", B[bh])))))
        T.cuda.cta_sync()
        if j < DK:
            for i in T.unroll(DK):
                col[i] = SIN[bh * DK + j, i] * decay
            sc[2] = T.float32(0)
            for i in T.unroll(DK):
                sc[2] = sc[2] + ks[i] * col[i]
            delta: T.float32 = (T.Cast("float32", V[bh, j]) - sc[2]) * beta
            sc[3] = T.float32(0)
            for i in T.unroll(DK):
                col[i] = col[i] + ks[i] * delta
                sc[3] = sc[3] + qs[i] * col[i]
                SOUT[bh * DK + j, i] = col[i]
            O[bh, j] = T.Cast("bfloat16", sc[3])

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
    assert q.shape[3] == v.shape[3]
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
        state.contiguous().view(-1, dv), o.view(-1, dv), s_out.view(-1, dv))
    return o, s_out
