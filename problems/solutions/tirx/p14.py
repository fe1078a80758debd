"""p14 absorbed MLA paged decode (page size 1, bf16) in TIRx: chunked split-KV + merge kernel.

The token list is cut into chunks of CH tokens per sequence (work item = (sequence, chunk), found by a
scan of kv_indptr inside the kernel, so no host sync).  Kernel 1: a CTA of 256 threads per chunk,
16 threads per head (16 heads); a thread owns 32 of the 512 latent dims (8 x 4) and 4 of the 64 rope
dims, so every latent row it loads serves both the score and the output accumulation.  Scores are
summed over the 16 threads of a head with shuffles; online softmax in base 2 (q pre-scaled by
sm_scale*log2 e).  Kernel 2 merges a sequence's chunk partials per head: out, lse = M + log2 L.
"""
import math

import torch  # before tvm, so TVM's CUDA runtime finds the already-loaded CUDA libraries

import tvm
from tvm.script import tirx as T

RANK, ROPE = 512, 64
CH = 256
UNROLL = 2
NEG = -1.0e30
NK = RANK // 64
NKR = NK + 1          # 8 latent groups + 1 rope group of 4 dims per thread


def _make_partial(H: int, qscale: float):
    NT = 16 * H

    @T.prim_func
    def mla_partial(qn_h: T.handle, qp_h: T.handle, ckv_h: T.handle, kpe_h: T.handle, ptr_h: T.handle,
                    idx_h: T.handle, pm_h: T.handle, pl_h: T.handle, pacc_h: T.handle):
        qr = T.int32()
        pr = T.int32()
        nb1 = T.int32()
        nt = T.int32()
        npart = T.int32()
        QN = T.match_buffer(qn_h, (qr, RANK), "bfloat16", align=16)
        QP = T.match_buffer(qp_h, (qr, ROPE), "bfloat16", align=16)
        CKV = T.match_buffer(ckv_h, (pr, RANK), "bfloat16", align=16)
        KPE = T.match_buffer(kpe_h, (pr, ROPE), "bfloat16", align=16)
        PTR = T.match_buffer(ptr_h, (nb1,), "int32")
        IDX = T.match_buffer(idx_h, (nt,), "int32")
        PM = T.match_buffer(pm_h, (npart,), "float32")
        PL = T.match_buffer(pl_h, (npart,), "float32")
        PACC = T.match_buffer(pacc_h, (npart, RANK), "float32", align=16)
        T.device_entry()
        ci = T.cta_id([npart // H])
        tx = T.thread_id([NT])
        sel = T.alloc_local((3,), "int32")          # cum, bsel, csel
        rq = T.alloc_local((4,), "bfloat16")
        qf = T.alloc_local((NKR * 4,), "float32")
        acc = T.alloc_local((NK * 4,), "float32")
        rc = T.alloc_local((UNROLL * NKR * 4,), "bfloat16")
        rows = T.alloc_local((UNROLL,), "int32")
        st = T.alloc_local((3,), "float32")         # m, l, score
        h: T.let = tx // 16
        ln: T.let = tx % 16
        sel[0] = 0
        sel[1] = -1
        sel[2] = 0
        for bb in T.serial(nb1 - 1):
            n: T.let = (PTR[bb + 1] - PTR[bb] + CH - 1) // CH
            if sel[1] < 0:
                if ci < sel[0] + n:
                    sel[1] = bb
                    sel[2] = ci - sel[0]
            sel[0] = sel[0] + n
        if sel[1] >= 0:
            t0: T.let = PTR[sel[1]] + sel[2] * CH
            t1: T.let = T.min(t0 + CH, PTR[sel[1] + 1])
            qrow: T.let = sel[1] * H + h
            for k in T.unroll(NK):
                T.tile.copy(rq[:], QN[qrow, k * 64 + ln * 4:k * 64 + ln * 4 + 4])
                for e in T.unroll(4):
                    qf[k * 4 + e] = T.Cast("float32", rq[e]) * T.float32(qscale)
            T.tile.copy(rq[:], QP[qrow, ln * 4:ln * 4 + 4])
            for e in T.unroll(4):
                qf[NK * 4 + e] = T.Cast("float32", rq[e]) * T.float32(qscale)
            for i in T.unroll(NK * 4):
                acc[i] = T.float32(0)
            st[0] = T.float32(NEG)
            st[1] = T.float32(0)
            for it in T.serial(T.ceildiv(t1 - t0, UNROLL)):
                i: T.let = t0 + it * UNROLL
                for uu in T.unroll(UNROLL):
                    rows[uu] = IDX[T.min(i + uu, t1 - 1)]
                for uu in T.unroll(UNROLL):
                    for k in T.unroll(NK):
                        T.tile.copy(rc[(uu * NKR + k) * 4:(uu * NKR + k) * 4 + 4],
                                    CKV[rows[uu], k * 64 + ln * 4:k * 64 + ln * 4 + 4])
                    T.tile.copy(rc[(uu * NKR + NK) * 4:(uu * NKR + NK) * 4 + 4], KPE[rows[uu], ln * 4:ln * 4 + 4])
                for uu in T.unroll(UNROLL):
                    if i + uu < t1:
                        st[2] = T.float32(0)
                        for k in T.unroll(NKR * 4):
                            st[2] = st[2] + qf[k] * T.Cast("float32", rc[uu * NKR * 4 + k])
                        sc: T.float32 = T.cuda.warp_sum(st[2], 16)
                        m_new: T.float32 = T.max(st[0], sc)
                        corr: T.float32 = T.exp2(st[0] - m_new)
                        p: T.float32 = T.exp2(sc - m_new)
                        st[1] = st[1] * corr + p
                        for k in T.unroll(NK * 4):
                            acc[k] = acc[k] * corr + p * T.Cast("float32", rc[uu * NKR * 4 + k])
                        st[0] = m_new
            prow: T.let = ci * H + h
            if ln == 0:
                PM[prow] = st[0]
                PL[prow] = st[1]
            for k in T.unroll(NK):
                for e in T.unroll(4):
                    PACC[prow, k * 64 + ln * 4 + e] = acc[k * 4 + e]

    return mla_partial


def _make_merge(H: int):
    @T.prim_func
    def mla_merge(ptr_h: T.handle, pm_h: T.handle, pl_h: T.handle, pacc_h: T.handle, out_h: T.handle,
                  lse_h: T.handle):
        nb1 = T.int32()
        npart = T.int32()
        qr = T.int32()
        PTR = T.match_buffer(ptr_h, (nb1,), "int32")
        PM = T.match_buffer(pm_h, (npart,), "float32")
        PL = T.match_buffer(pl_h, (npart,), "float32")
        PACC = T.match_buffer(pacc_h, (npart, RANK), "float32", align=16)
        OUT = T.match_buffer(out_h, (qr, RANK), "bfloat16", align=16)
        LSE = T.match_buffer(lse_h, (qr,), "float32")
        T.device_entry()
        bh = T.cta_id([qr])
        tx = T.thread_id([RANK // 4])
        cr = T.alloc_local((1,), "int32")
        red = T.alloc_local((2,), "float32")      # M, L
        o = T.alloc_local((4,), "float32")
        ro = T.alloc_local((4,), "bfloat16")
        b: T.let = bh // H
        h: T.let = bh % H
        cr[0] = 0
        for bb in T.serial(b):
            cr[0] = cr[0] + (PTR[bb + 1] - PTR[bb] + CH - 1) // CH
        c0: T.let = cr[0]
        c1: T.let = c0 + (PTR[b + 1] - PTR[b] + CH - 1) // CH
        red[0] = T.float32(NEG)
        for c in T.serial(c1 - c0):
            red[0] = T.max(red[0], PM[(c0 + c) * H + h])
        red[1] = T.float32(0)
        for e in T.unroll(4):
            o[e] = T.float32(0)
        for c in T.serial(c1 - c0):
            w: T.float32 = T.exp2(PM[(c0 + c) * H + h] - red[0])
            red[1] = red[1] + PL[(c0 + c) * H + h] * w
            for e in T.unroll(4):
                o[e] = o[e] + PACC[(c0 + c) * H + h, tx * 4 + e] * w
        for e in T.unroll(4):
            ro[e] = T.Cast("bfloat16", o[e] / red[1])
        T.tile.copy(OUT[bh, tx * 4:tx * 4 + 4], ro[:])
        if tx == 0:
            LSE[bh] = red[0] + T.log2(red[1])

    return mla_merge


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _build(func, arch):
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    with target:
        return tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")


def _prepare(q_nope, q_pe, ckv_cache, kpe_cache, kv_indptr, kv_indices, sm_scale, arch=None):
    heads = q_nope.shape[1]
    assert q_nope.shape[2] == RANK and q_pe.shape[2] == ROPE
    key = (heads, float(sm_scale))
    if key not in _COMPILED:
        a = arch or _arch()
        qscale = float(sm_scale) * math.log2(math.e)
        _COMPILED[key] = (_build(_make_partial(heads, qscale), a), _build(_make_merge(heads), a))
    return list(_COMPILED[key])


def solve(q_nope, q_pe, ckv_cache, kpe_cache, kv_indptr, kv_indices, sm_scale):
    partial, merge = _prepare(q_nope, q_pe, ckv_cache, kpe_cache, kv_indptr, kv_indices, sm_scale)
    batch, heads, _ = q_nope.shape
    nchunks = kv_indices.shape[0] // CH + batch          # upper bound on sum(ceil(len/CH)), no host sync
    dev = q_nope.device
    pm = torch.empty(nchunks * heads, dtype=torch.float32, device=dev)
    pl = torch.empty(nchunks * heads, dtype=torch.float32, device=dev)
    pacc = torch.empty(nchunks * heads, RANK, dtype=torch.float32, device=dev)
    partial(q_nope.contiguous().view(-1, RANK), q_pe.contiguous().view(-1, ROPE),
            ckv_cache.contiguous().view(-1, RANK), kpe_cache.contiguous().view(-1, ROPE), kv_indptr.contiguous(),
            kv_indices.contiguous(), pm, pl, pacc)
    out = torch.empty(batch * heads, RANK, dtype=q_nope.dtype, device=dev)
    lse = torch.empty(batch * heads, dtype=torch.float32, device=dev)
    merge(kv_indptr.contiguous(), pm, pl, pacc, out, lse)
    return out.view(batch, heads, RANK), lse.view(batch, heads)
