"""p15 causal absorbed-MLA paged prefill (page size 1, 16 heads, latent 512 + rope 64, bf16) in TIRx: a warp per (query, 4 heads).

Work item = one query of one sequence x a group of R = 4 heads, found by a scan of qo_indptr inside the
kernel (no host sync); queries are handed out last sequence first and, inside a sequence, last query
first (its longest walks first).  Every head attends over the same latent rows, so the key of
token j is [ckv_j, kpe_j] and its value is ckv_j itself: a lane holds 16 of the 512 latent dims and 2 of
the 64 rope dims of each key row (found through the page table: key j of sequence b is cache row
kv_indices[kv_indptr[b] + j]), and the ckv registers it loads serve as both K and V for its 4 heads.
Per key: 4 dot products (16 latent then 2 rope terms per lane, a butterfly shuffle sum over the warp),
the causal mask (key <= query + kv_len - q_len, the same on every lane) and an online softmax in base 2
(q pre-scaled by sm_scale*log2 e).  The softmax denominator is kept per lane (lane j % 32 adds key j's
term, every lane rescales; one butterfly sum at the end), so it carries far less rounding than one
serial sum.  The warp writes out = acc / l (bf16, 16 dims a lane) and lse = m + log2 l.
"""
import math

import torch  # before tvm, so TVM's CUDA runtime finds the already-loaded CUDA libraries

import tvm
from tvm.script import tirx as T

DC = 512               # latent (ckv) dims: K and V
DP = 64                # rope (kpe) dims: K only
VC, VP = DC // 32, DP // 32
R = 4                  # heads per warp: 4 heads share each latent row load
WARPS = 4
UNROLL = 2
NEG = -1.0e30


def _make(H: int, qscale: float):

    @T.prim_func
    def mla_paged_prefill(qn_h: T.handle, qp_h: T.handle, ckv_h: T.handle, kpe_h: T.handle, qo_h: T.handle,
                          kv_h: T.handle, idx_h: T.handle, out_h: T.handle, lse_h: T.handle):
        qrows = T.int32()
        pool = T.int32()
        nb1 = T.int32()
        nt = T.int32()
        QN = T.match_buffer(qn_h, (qrows, DC), "bfloat16", align=16)
        QP = T.match_buffer(qp_h, (qrows, DP), "bfloat16", align=4)
        CKV = T.match_buffer(ckv_h, (pool, DC), "bfloat16", align=16)
        KPE = T.match_buffer(kpe_h, (pool, DP), "bfloat16", align=4)
        QO = T.match_buffer(qo_h, (nb1,), "int32")
        KV = T.match_buffer(kv_h, (nb1,), "int32")
        IDX = T.match_buffer(idx_h, (nt,), "int32")
        OUT = T.match_buffer(out_h, (qrows, DC), "bfloat16", align=16)
        LSE = T.match_buffer(lse_h, (qrows,), "float32")
        T.device_entry()
        bx, hg = T.cta_id([T.ceildiv(qrows // H, WARPS), H // R])
        tx = T.thread_id([32 * WARPS])
        sel = T.alloc_local((3,), "int32")          # cum, bsel, isel
        rqc = T.alloc_local((VC,), "bfloat16")
        rqp = T.alloc_local((VP,), "bfloat16")
        qc = T.alloc_local((R * VC,), "float32")
        qr = T.alloc_local((R * VP,), "float32")
        m = T.alloc_local((R,), "float32")
        l = T.alloc_local((R,), "float32")          # this lane's share of the denominator
        acc = T.alloc_local((R * VC,), "float32")
        rc = T.alloc_local((UNROLL * VC,), "bfloat16")
        rp = T.alloc_local((UNROLL * VP,), "bfloat16")
        rows = T.alloc_local((UNROLL,), "int32")
        ro = T.alloc_local((VC,), "bfloat16")
        part = T.alloc_local((1,), "float32")
        rtile: T.let = bx * WARPS + tx // 32         # queries counted from the last one (see the scan)
        cc = T.meta_var((tx % 32) * VC)
        cp = T.meta_var((tx % 32) * VP)
        sel[0] = 0
        sel[1] = -1
        sel[2] = 0
        for bi in T.serial(nb1 - 1):
            bb: T.let = nb1 - 2 - bi
            n: T.let = QO[bb + 1] - QO[bb]
            if sel[1] < 0:
                if rtile < sel[0] + n:
                    sel[1] = bb
                    sel[2] = n - 1 - (rtile - sel[0])
            sel[0] = sel[0] + n
        if sel[1] >= 0:
            b: T.let = sel[1]
            p0: T.let = KV[b]
            kend: T.let = sel[2] + KV[b + 1] - p0 - (QO[b + 1] - QO[b]) + 1    # the query sees keys [0, kend)
            qrow0: T.let = (QO[b] + sel[2]) * H + hg * R
            for r in T.unroll(R):
                T.tile.copy(rqc[:], QN[qrow0 + r, cc:cc + VC])
                T.tile.copy(rqp[:], QP[qrow0 + r, cp:cp + VP])
                for e in T.unroll(VC):
                    qc[r * VC + e] = T.Cast("float32", rqc[e]) * T.float32(qscale)
                for e in T.unroll(VP):
                    qr[r * VP + e] = T.Cast("float32", rqp[e]) * T.float32(qscale)
                m[r] = T.float32(NEG)
                l[r] = T.float32(0)
                for e in T.unroll(VC):
                    acc[r * VC + e] = T.float32(0)
            for it in T.serial(T.ceildiv(kend, UNROLL)):
                j: T.let = it * UNROLL
                for uu in T.unroll(UNROLL):
                    rows[uu] = IDX[p0 + T.min(j + uu, kend - 1)]
                for uu in T.unroll(UNROLL):
                    T.tile.copy(rc[uu * VC:uu * VC + VC], CKV[rows[uu], cc:cc + VC])
                    T.tile.copy(rp[uu * VP:uu * VP + VP], KPE[rows[uu], cp:cp + VP])
                for uu in T.unroll(UNROLL):
                    for r in T.unroll(R):
                        part[0] = T.float32(0)
                        for e in T.unroll(VC):
                            part[0] = part[0] + qc[r * VC + e] * T.Cast("float32", rc[uu * VC + e])
                        for e in T.unroll(VP):
                            part[0] = part[0] + qr[r * VP + e] * T.Cast("float32", rp[uu * VP + e])
                        sc: T.float32 = T.cuda.warp_sum(part[0])
                        if j + uu < kend:                        # causal (also ends the last partial step)
                            m_new: T.float32 = T.max(m[r], sc)
                            corr: T.float32 = T.exp2(m[r] - m_new)
                            p: T.float32 = T.exp2(sc - m_new)
                            l[r] = l[r] * corr
                            if (j + uu) % 32 == tx % 32:
                                l[r] = l[r] + p
                            for e in T.unroll(VC):
                                acc[r * VC + e] = acc[r * VC + e] * corr + p * T.Cast("float32", rc[uu * VC + e])
                            m[r] = m_new
            for r in T.unroll(R):
                lsum: T.float32 = T.cuda.warp_sum(l[r])     # every lane: the whole denominator
                inv: T.float32 = T.float32(1) / lsum
                for e in T.unroll(VC):
                    ro[e] = T.Cast("bfloat16", acc[r * VC + e] * inv)
                T.tile.copy(OUT[qrow0 + r, cc:cc + VC], ro[:])
                if tx % 32 == 0:
                    LSE[qrow0 + r] = m[r] + T.log2(lsum)

    return mla_paged_prefill


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _build(func, arch):
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    with target:
        return tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")


def _prepare(q_nope, q_pe, ckv_cache, kpe_cache, qo_indptr, kv_indptr, kv_indices, sm_scale, arch=None):
    heads = q_nope.shape[1]
    assert q_nope.shape[2] == DC and q_pe.shape[2] == DP and heads % R == 0
    assert ckv_cache.shape[1] == 1 and ckv_cache.shape[2] == DC and kpe_cache.shape[2] == DP
    key = (heads, float(sm_scale))
    if key not in _COMPILED:
        qscale = float(sm_scale) * math.log2(math.e)
        _COMPILED[key] = (_build(_make(heads, qscale), arch or _arch()),)
    return list(_COMPILED[key])


def solve(q_nope, q_pe, ckv_cache, kpe_cache, qo_indptr, kv_indptr, kv_indices, sm_scale):
    (prefill,) = _prepare(q_nope, q_pe, ckv_cache, kpe_cache, qo_indptr, kv_indptr, kv_indices, sm_scale)
    total_q, heads, _ = q_nope.shape
    out = torch.empty(total_q * heads, DC, dtype=q_nope.dtype, device=q_nope.device)
    lse = torch.empty(total_q * heads, dtype=torch.float32, device=q_nope.device)
    prefill(q_nope.contiguous().view(-1, DC), q_pe.contiguous().view(-1, DP), ckv_cache.contiguous().view(-1, DC),
            kpe_cache.contiguous().view(-1, DP), qo_indptr.contiguous(), kv_indptr.contiguous(),
            kv_indices.contiguous(), out, lse)
    return out.view(total_q, heads, DC), lse.view(total_q, heads)
