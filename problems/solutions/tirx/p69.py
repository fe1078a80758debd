"""p69 gated linear attention (GLA) recurrence in TIRx, token by token in fp32.

S_t = Diag(exp(gk_t)) S_{t-1} + k_t v_t^T, o_t = S_t^T (q_t K^-0.5), from a zero state.  Every value
column j evolves on its own, so the state [K, V] of a (sequence, head) is split over columns: a CTA
owns 64 columns, a thread owns 4 of them on K/16 rows (rows rc, rc + 16, ...: conflict-free shared
reads) in registers for the whole sequence, and the 16 threads of a column group (adjacent lanes)
combine o with a 16-lane warp sum.  The sequence runs in chunks of 8 tokens: the chunk's q K^-0.5,
k, exp(gk) (in fp64, exact libm unaffected by fast math, rounded once; once per CTA) and the CTA's
v columns are staged in shared memory as fp32, and the next chunk is loaded into registers while
this one is processed.  o is written per token (bf16).
"""
import torch  # before tvm, so TVM's CUDA runtime finds the already-loaded CUDA libraries

import tvm
from tvm.script import tirx as T

RT = 16                 # threads per column group (row split)
CPT = 4                 # columns per thread
TC = 8                  # tokens per staged chunk


def _make(H: int, DK: int, DV: int, SEQ: int):
    assert DK % RT == 0 and DV % CPT == 0 and SEQ % TC == 0
    R = DK // RT
    NCG = min(16, DV // CPT)
    COLS = NCG * CPT
    assert DV % COLS == 0
    NT = RT * NCG
    NLK = (TC * DK + NT - 1) // NT
    NLV = (TC * COLS + NT - 1) // NT
    NC = SEQ // TC
    SCALE = DK ** -0.5

    @T.prim_func
    def gla(q_h: T.handle, k_h: T.handle, v_h: T.handle, g_h: T.handle, o_h: T.handle):
        rows = T.int32()
        Q = T.match_buffer(q_h, (rows, DK), "bfloat16")
        K = T.match_buffer(k_h, (rows, DK), "bfloat16")
        V = T.match_buffer(v_h, (rows, DV), "bfloat16")
        G = T.match_buffer(g_h, (rows, DK), "bfloat16")
        O = T.match_buffer(o_h, (rows, DV), "bfloat16")
        T.device_entry()
        cb, bh = T.cta_id([DV // COLS, rows // SEQ])
        tx = T.thread_id([NT])
        qs = T.alloc_shared((TC * DK,), "float32")
        ks = T.alloc_shared((TC * DK,), "float32")
        ds = T.alloc_shared((TC * DK,), "float32")
        vs = T.alloc_shared((TC * COLS,), "float32")
        S = T.alloc_local((R * CPT,), "float32")
        pq = T.alloc_local((NLK,), "bfloat16")
        pk = T.alloc_local((NLK,), "bfloat16")
        pg = T.alloc_local((NLK,), "bfloat16")
        pv = T.alloc_local((NLV,), "bfloat16")
        vv = T.alloc_local((CPT,), "float32")
        ov = T.alloc_local((CPT,), "float32")
        base = T.alloc_local((1,), "int32")     # row of (sequence, token 0, head): loop-invariant
        rc: T.let = tx % RT
        cg: T.let = tx // RT
        base[0] = (bh // H) * SEQ * H + bh % H
        for x in T.unroll(R * CPT):
            S[x] = T.float32(0)
        for m in T.unroll(NLK):
            if tx + NT * m < TC * DK:
                pq[m] = Q[base[0] + ((tx + NT * m) // DK) * H, (tx + NT * m) % DK]
                pk[m] = K[base[0] + ((tx + NT * m) // DK) * H, (tx + NT * m) % DK]
                pg[m] = G[base[0] + ((tx + NT * m) // DK) * H, (tx + NT * m) % DK]
        for m in T.unroll(NLV):
            if tx + NT * m < TC * COLS:
                pv[m] = V[base[0] + ((tx + NT * m) // COLS) * H, cb * COLS + (tx + NT * m) % COLS]
        for c in T.serial(NC):
            for m in T.unroll(NLK):
                if tx + NT * m < TC * DK:
                    qs[tx + NT * m] = T.Cast("float32", pq[m]) * T.float32(SCALE)
                    ks[tx + NT * m] = T.Cast("float32", pk[m])
                    ds[tx + NT * m] = T.Cast("float32", T.exp(T.Cast("float64", T.Cast("float32", pg[m]))))
            for m in T.unroll(NLV):
                if tx + NT * m < TC * COLS:
                    vs[tx + NT * m] = T.Cast("float32", pv[m])
            T.cuda.cta_sync()
            if c + 1 < NC:
                for m in T.unroll(NLK):
                    if tx + NT * m < TC * DK:
                        pq[m] = Q[base[0] + ((c + 1) * TC + (tx + NT * m) // DK) * H, (tx + NT * m) % DK]
                        pk[m] = K[base[0] + ((c + 1) * TC + (tx + NT * m) // DK) * H, (tx + NT * m) % DK]
                        pg[m] = G[base[0] + ((c + 1) * TC + (tx + NT * m) // DK) * H, (tx + NT * m) % DK]
                for m in T.unroll(NLV):
                    if tx + NT * m < TC * COLS:
                        pv[m] = V[base[0] + ((c + 1) * TC + (tx + NT * m) // COLS) * H,
                                  cb * COLS + (tx + NT * m) % COLS]
            for tt in T.unroll(TC):
                for x in T.unroll(CPT):
                    vv[x] = vs[tt * COLS + cg * CPT + x]
                    ov[x] = T.float32(0)
                for r in T.unroll(R):
                    for x in T.unroll(CPT):
                        S[r * CPT + x] = S[r * CPT + x] * ds[tt * DK + r * RT + rc] + ks[tt * DK + r * RT + rc] * vv[x]
                        ov[x] = ov[x] + qs[tt * DK + r * RT + rc] * S[r * CPT + x]
                for x in T.unroll(CPT):
                    ot: T.float32 = T.cuda.warp_sum(ov[x], RT)
                    if rc == 0:
                        O[base[0] + (c * TC + tt) * H, cb * COLS + cg * CPT + x] = T.Cast("bfloat16", ot)
            T.cuda.cta_sync()

    return gla


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _build(func, arch):
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    with target:
        return tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")


def _prepare(q, k, v, gk, arch=None):
    key = (q.shape[2], q.shape[3], v.shape[3], q.shape[1])
    if key not in _COMPILED:
        _COMPILED[key] = _build(_make(*key), arch or _arch())
    return [_COMPILED[key]]


def solve(q, k, v, gk):
    (exe,) = _prepare(q, k, v, gk)
    dk, dv = q.shape[3], v.shape[3]
    o = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    exe(q.contiguous().view(-1, dk), k.contiguous().view(-1, dk), v.contiguous().view(-1, dv),
        gk.contiguous().view(-1, dk), o.view(-1, dv))
    return o
