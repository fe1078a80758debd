"""p05 causal GQA paged prefill (page size 1, 5 q heads : 1 kv head, head dim 128, bf16) in TIRx: a warp per row tile.

Work item = (sequence, tile of QT queries) x kv head, found by a scan of qo_indptr inside the kernel (no
host sync); tiles are handed out last sequence first and, inside a sequence, last query first, so the
longest walks start first.  A warp owns the R = QT x G (query, head) rows of its tile that read the kv
head: each K and V row it loads (found through the page table: key j of sequence b is cache row
kv_indices[kv_indptr[b] + j]) serves all R rows.  A lane holds 4 of the 128 dims of q, K, V and the
output.  Per key: R dot products summed over the warp with butterfly shuffles, the causal mask (key <=
query + kv_len - q_len, per row and the same on every lane) and an online softmax in base 2 (q
pre-scaled by sm_scale*log2 e).  The softmax denominator is kept per lane (lane j % 32 adds key j's
term, every lane rescales), so each partial sums 1/32 of the keys and one butterfly sum at the end
gives l: a 5,139-key row's denominator then carries ~6x less rounding than one serial sum (the lse
output's allowance is a few fp32 ulps).  The warp writes out = acc / l (bf16) and lse = m + log2 l.
"""
import math

import torch  # before tvm, so TVM's CUDA runtime finds the already-loaded CUDA libraries

import tvm
from tvm.script import tirx as T

D = 128
VEC = D // 32          # dims per lane
QT = 2                 # queries per warp tile: 2 queries x 5 heads share each K/V row load
WARPS = 4
UNROLL = 4
NEG = -1.0e30


def _make(KVH: int, G: int, qscale: float):
    H = KVH * G
    R = QT * G

    @T.prim_func
    def paged_prefill(q_h: T.handle, k_h: T.handle, v_h: T.handle, qo_h: T.handle, kv_h: T.handle,
                      idx_h: T.handle, out_h: T.handle, lse_h: T.handle):
        qr = T.int32()
        kr = T.int32()
        nb1 = T.int32()
        nt = T.int32()
        Q = T.match_buffer(q_h, (qr, D), "bfloat16", align=16)
        K = T.match_buffer(k_h, (kr, D), "bfloat16", align=16)
        V = T.match_buffer(v_h, (kr, D), "bfloat16", align=16)
        QO = T.match_buffer(qo_h, (nb1,), "int32")
        KV = T.match_buffer(kv_h, (nb1,), "int32")
        IDX = T.match_buffer(idx_h, (nt,), "int32")
        OUT = T.match_buffer(out_h, (qr, D), "bfloat16", align=16)
        LSE = T.match_buffer(lse_h, (qr,), "float32")
        T.device_entry()
        bx, g = T.cta_id([T.ceildiv(qr // (H * QT) + nb1 - 1, WARPS), KVH])
        tx = T.thread_id([32 * WARPS])
        sel = T.alloc_local((3,), "int32")          # cum, bsel, tsel
        rq = T.alloc_local((VEC,), "bfloat16")
        qf = T.alloc_local((R * VEC,), "float32")
        m = T.alloc_local((R,), "float32")
        l = T.alloc_local((R,), "float32")          # this lane's share of the denominator
        acc = T.alloc_local((R * VEC,), "float32")
        rk = T.alloc_local((UNROLL * VEC,), "bfloat16")
        rv = T.alloc_local((UNROLL * VEC,), "bfloat16")
        rows = T.alloc_local((UNROLL,), "int32")
        ro = T.alloc_local((VEC,), "bfloat16")
        part = T.alloc_local((1,), "float32")
        rtile: T.let = bx * WARPS + tx // 32         # tiles counted from the last one (see the scan)
        c0 = T.meta_var((tx % 32) * VEC)
        sel[0] = 0
        sel[1] = -1
        sel[2] = 0
        for bi in T.serial(nb1 - 1):
            bb: T.let = nb1 - 2 - bi
            n: T.let = (QO[bb + 1] - QO[bb] + QT - 1) // QT
            if sel[1] < 0:
                if rtile < sel[0] + n:
                    sel[1] = bb
                    sel[2] = n - 1 - (rtile - sel[0])
            sel[0] = sel[0] + n
        if sel[1] >= 0:
            b: T.let = sel[1]
            qlen: T.let = QO[b + 1] - QO[b]
            p0: T.let = KV[b]
            off: T.let = KV[b + 1] - p0 - qlen          # query i sees keys j <= i + off
            i0: T.let = sel[2] * QT                      # first query of the tile, in the sequence
            nq: T.let = T.min(QT, qlen - i0)
            kend: T.let = i0 + nq + off                  # keys [0, kend) are seen by some row of the tile
            for r in T.unroll(R):
                T.tile.copy(rq[:], Q[(QO[b] + i0 + T.min(r // G, nq - 1)) * H + g * G + r % G, c0:c0 + VEC])
                for e in T.unroll(VEC):
                    qf[r * VEC + e] = T.Cast("float32", rq[e]) * T.float32(qscale)
                m[r] = T.float32(NEG)
                l[r] = T.float32(0)
                for e in T.unroll(VEC):
                    acc[r * VEC + e] = T.float32(0)
            for it in T.serial(T.ceildiv(kend, UNROLL)):
                j: T.let = it * UNROLL
                for uu in T.unroll(UNROLL):
                    rows[uu] = IDX[p0 + T.min(j + uu, kend - 1)] * KVH + g
                for uu in T.unroll(UNROLL):
                    T.tile.copy(rk[uu * VEC:uu * VEC + VEC], K[rows[uu], c0:c0 + VEC])
                    T.tile.copy(rv[uu * VEC:uu * VEC + VEC], V[rows[uu], c0:c0 + VEC])
                for uu in T.unroll(UNROLL):
                    for r in T.unroll(R):
                        part[0] = T.float32(0)
                        for e in T.unroll(VEC):
                            part[0] = part[0] + qf[r * VEC + e] * T.Cast("float32", rk[uu * VEC + e])
                        sc: T.float32 = T.cuda.warp_sum(part[0])
                        if j + uu <= i0 + r // G + off:          # causal (also ends the last partial step)
                            m_new: T.float32 = T.max(m[r], sc)
                            corr: T.float32 = T.exp2(m[r] - m_new)
                            p: T.float32 = T.exp2(sc - m_new)
                            l[r] = l[r] * corr
                            if (j + uu) % 32 == tx % 32:
                                l[r] = l[r] + p
                            for e in T.unroll(VEC):
                                acc[r * VEC + e] = acc[r * VEC + e] * corr + p * T.Cast("float32", rv[uu * VEC + e])
                            m[r] = m_new
            for r in T.unroll(R):
                lsum: T.float32 = T.cuda.warp_sum(l[r])     # every lane: the whole denominator
                if r // G < nq:
                    orow: T.let = (QO[b] + i0 + r // G) * H + g * G + r % G
                    inv: T.float32 = T.float32(1) / lsum
                    for e in T.unroll(VEC):
                        ro[e] = T.Cast("bfloat16", acc[r * VEC + e] * inv)
                    T.tile.copy(OUT[orow, c0:c0 + VEC], ro[:])
                    if tx % 32 == 0:
                        LSE[orow] = m[r] + T.log2(lsum)

    return paged_prefill


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _build(func, arch):
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    with target:
        return tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")


def _prepare(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, sm_scale, arch=None):
    heads = q.shape[1]
    page_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    assert q.shape[2] == D and page_size == 1 and heads % kv_heads == 0
    key = (heads, kv_heads, float(sm_scale))
    if key not in _COMPILED:
        qscale = float(sm_scale) * math.log2(math.e)
        _COMPILED[key] = (_build(_make(kv_heads, heads // kv_heads, qscale), arch or _arch()),)
    return list(_COMPILED[key])


def solve(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, sm_scale):
    (prefill,) = _prepare(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, sm_scale)
    total_q, heads, _ = q.shape
    out = torch.empty(total_q * heads, D, dtype=q.dtype, device=q.device)
    lse = torch.empty(total_q * heads, dtype=torch.float32, device=q.device)
    prefill(q.contiguous().view(-1, D), k_cache.contiguous().view(-1, D), v_cache.contiguous().view(-1, D),
            qo_indptr.contiguous(), kv_indptr.contiguous(), kv_indices.contiguous(), out, lse)
    return out.view(total_q, heads, D), lse.view(total_q, heads)
