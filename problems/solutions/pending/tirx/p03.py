"""p03 GQA paged decode (page size 64, bf16) in TIRx: chunked split-KV flash decoding + merge.

The sequences' tokens are cut into chunks of CH tokens (work item = (sequence, chunk), found by a scan
of kv_indptr and kv_last_page_len inside the kernel: no host sync, and the longest sequence is spread
over many CTAs).  Kernel 1: a CTA per (chunk, kv head), four warps, each warp two half-warp streams of
SUB consecutive tokens; a lane holds 8 of the 128 dims (16-byte loads of the token's K and V rows,
found through the page table), scores the 4 query heads of the kv head (4 butterfly shuffles inside
the half-warp) and keeps an online softmax in base 2 (q pre-scaled by sm_scale*log2 e).  The two
halves merge with one xor-16 exchange and the warp writes (m, l, acc).  Kernel 2 merges a sequence's
partials per head: out = sum acc*2^(m-M) / L, lse = M + log2 L.
"""
import math

import torch  # before tvm, so TVM's CUDA runtime finds the already-loaded CUDA libraries

import tvm
from tvm.script import tirx as T

D = 128
VEC = 8                      # dims per lane: one 16-byte load
HALF = D // VEC              # lanes per token (16)
WARPS = 4
CH = 2048                    # tokens per chunk
SUB = CH // (2 * WARPS)      # tokens per half-warp stream
UNROLL = 4
NEG = -1.0e30
FULL = 0xFFFFFFFF


def _make_partial(KVH: int, G: int, PS: int, qscale: float):
    H = KVH * G

    @T.prim_func
    def paged_partial(q_h: T.handle, k_h: T.handle, v_h: T.handle, ptr_h: T.handle, idx_h: T.handle,
                      last_h: T.handle, pm_h: T.handle, pl_h: T.handle, pacc_h: T.handle):
        qrows = T.int32()
        kr = T.int32()
        nb1 = T.int32()
        nb = T.int32()
        nt = T.int32()
        npart = T.int32()
        Q = T.match_buffer(q_h, (qrows, D), "bfloat16", align=16)
        K = T.match_buffer(k_h, (kr, D), "bfloat16", align=16)
        V = T.match_buffer(v_h, (kr, D), "bfloat16", align=16)
        PTR = T.match_buffer(ptr_h, (nb1,), "int32")
        IDX = T.match_buffer(idx_h, (nt,), "int32")
        LAST = T.match_buffer(last_h, (nb,), "int32")
        PM = T.match_buffer(pm_h, (npart,), "float32")
        PL = T.match_buffer(pl_h, (npart,), "float32")
        PACC = T.match_buffer(pacc_h, (npart, D), "float32", align=16)
        T.device_entry()
        ci, g = T.cta_id([npart // (WARPS * H), KVH])
        tx = T.thread_id([32 * WARPS])
        sel = T.alloc_local((3,), "int32")          # cum, bsel, csel
        rq = T.alloc_local((VEC,), "bfloat16")
        qf = T.alloc_local((G * VEC,), "float32")
        m = T.alloc_local((G,), "float32")
        l = T.alloc_local((G,), "float32")
        acc = T.alloc_local((G * VEC,), "float32")
        rk = T.alloc_local((UNROLL * VEC,), "bfloat16")
        rv = T.alloc_local((UNROLL * VEC,), "bfloat16")
        rows = T.alloc_local((UNROLL,), "int32")
        part = T.alloc_local((1,), "float32")
        warp: T.let = tx // 32
        half: T.let = (tx % 32) // HALF
        col = T.meta_var((tx % HALF) * VEC)
        sel[0] = 0
        sel[1] = -1
        sel[2] = 0
        for bb in T.serial(nb1 - 1):
            npg: T.let = PTR[bb + 1] - PTR[bb]
            n: T.let = (T.max(npg - 1, 0) * PS + T.min(npg, 1) * LAST[bb] + CH - 1) // CH
            if sel[1] < 0:
                if ci < sel[0] + n:
                    sel[1] = bb
                    sel[2] = ci - sel[0]
            sel[0] = sel[0] + n
        if sel[1] >= 0:
            b: T.let = sel[1]
            p0: T.let = PTR[b]
            slen: T.let = T.max(PTR[b + 1] - p0 - 1, 0) * PS + T.min(PTR[b + 1] - p0, 1) * LAST[b]
            t_lo: T.let = sel[2] * CH + 2 * warp * SUB
            cnt: T.let = T.min(T.max(slen - t_lo, 0), SUB)     # half 0's count, the larger: warp-uniform
            s0: T.let = t_lo + half * SUB
            s1: T.let = T.min(s0 + SUB, slen)
            for j in T.unroll(G):
                T.tile.copy(rq[:], Q[b * H + g * G + j, col:col + VEC])
                for e in T.unroll(VEC):
                    qf[j * VEC + e] = T.Cast("float32", rq[e]) * T.float32(qscale)
                m[j] = T.float32(NEG)
                l[j] = T.float32(0)
                for e in T.unroll(VEC):
                    acc[j * VEC + e] = T.float32(0)
            for it in T.serial(T.ceildiv(cnt, UNROLL)):
                i: T.let = s0 + it * UNROLL
                for uu in T.unroll(UNROLL):
                    tok: T.let = T.min(i + uu, slen - 1)        # clamped: every lane loads and shuffles
                    rows[uu] = (IDX[p0 + tok // PS] * PS + tok % PS) * KVH + g
                for uu in T.unroll(UNROLL):
                    T.tile.copy(rk[uu * VEC:uu * VEC + VEC], K[rows[uu], col:col + VEC])
                    T.tile.copy(rv[uu * VEC:uu * VEC + VEC], V[rows[uu], col:col + VEC])
                for uu in T.unroll(UNROLL):
                    for j in T.unroll(G):
                        part[0] = T.float32(0)
                        for e in T.unroll(VEC):
                            part[0] = part[0] + qf[j * VEC + e] * T.Cast("float32", rk[uu * VEC + e])
                        sc: T.float32 = T.cuda.warp_sum(part[0], HALF)
                        if i + uu < s1:
                            m_new: T.float32 = T.max(m[j], sc)
                            corr: T.float32 = T.exp2(m[j] - m_new)
                            p: T.float32 = T.exp2(sc - m_new)
                            l[j] = l[j] * corr + p
                            for e in T.unroll(VEC):
                                acc[j * VEC + e] = acc[j * VEC + e] * corr + p * T.Cast("float32", rv[uu * VEC + e])
                            m[j] = m_new
            # the two half-warp streams hold the same dims: merge them with one xor-16 exchange
            for j in T.unroll(G):
                mo: T.float32 = T.tvm_warp_shuffle_xor(T.uint32(FULL), m[j], 16, 32, 32)
                lo: T.float32 = T.tvm_warp_shuffle_xor(T.uint32(FULL), l[j], 16, 32, 32)
                mx: T.float32 = T.max(m[j], mo)
                wa: T.float32 = T.exp2(m[j] - mx)
                wb: T.float32 = T.exp2(mo - mx)
                l[j] = l[j] * wa + lo * wb
                for e in T.unroll(VEC):
                    acc[j * VEC + e] = (acc[j * VEC + e] * wa
                                        + T.tvm_warp_shuffle_xor(T.uint32(FULL), acc[j * VEC + e], 16, 32, 32) * wb)
                m[j] = mx
            base: T.let = ((ci * KVH + g) * WARPS + warp) * G
            if half == 0:
                for j in T.unroll(G):
                    if tx % HALF == 0:
                        PM[base + j] = m[j]
                        PL[base + j] = l[j]
                    T.tile.copy(PACC[base + j, col:col + VEC], acc[j * VEC:j * VEC + VEC])

    return paged_partial


def _make_merge(KVH: int, G: int, PS: int):
    H = KVH * G

    @T.prim_func
    def paged_merge(ptr_h: T.handle, last_h: T.handle, pm_h: T.handle, pl_h: T.handle, pacc_h: T.handle,
                    out_h: T.handle, lse_h: T.handle):
        nb1 = T.int32()
        nb = T.int32()
        bh_total = T.int32()
        npart = T.int32()
        PTR = T.match_buffer(ptr_h, (nb1,), "int32")
        LAST = T.match_buffer(last_h, (nb,), "int32")
        PM = T.match_buffer(pm_h, (npart,), "float32")
        PL = T.match_buffer(pl_h, (npart,), "float32")
        PACC = T.match_buffer(pacc_h, (npart, D), "float32", align=16)
        OUT = T.match_buffer(out_h, (bh_total, D), "bfloat16", align=16)
        LSE = T.match_buffer(lse_h, (bh_total,), "float32")
        T.device_entry()
        bh = T.cta_id([bh_total])
        d = T.thread_id([D])
        cr = T.alloc_local((1,), "int32")
        mx = T.alloc_local((1,), "float32")
        L = T.alloc_local((1,), "float32")
        o = T.alloc_local((1,), "float32")
        b: T.let = bh // H
        g: T.let = (bh % H) // G
        j: T.let = bh % G
        cr[0] = 0
        for bb in T.serial(b):
            npg: T.let = PTR[bb + 1] - PTR[bb]
            cr[0] = cr[0] + (T.max(npg - 1, 0) * PS + T.min(npg, 1) * LAST[bb] + CH - 1) // CH
        nown: T.let = PTR[b + 1] - PTR[b]
        c0: T.let = cr[0]
        c1: T.let = c0 + (T.max(nown - 1, 0) * PS + T.min(nown, 1) * LAST[b] + CH - 1) // CH
        mx[0] = T.float32(NEG)
        for c in T.serial(c1 - c0):
            for w in T.unroll(WARPS):
                mx[0] = T.max(mx[0], PM[(((c0 + c) * KVH + g) * WARPS + w) * G + j])
        L[0] = T.float32(0)
        o[0] = T.float32(0)
        for c in T.serial(c1 - c0):
            for w in T.unroll(WARPS):
                wt: T.float32 = T.exp2(PM[(((c0 + c) * KVH + g) * WARPS + w) * G + j] - mx[0])
                L[0] = L[0] + PL[(((c0 + c) * KVH + g) * WARPS + w) * G + j] * wt
                o[0] = o[0] + PACC[(((c0 + c) * KVH + g) * WARPS + w) * G + j, d] * wt
        OUT[bh, d] = T.Cast("bfloat16", o[0] / L[0])
        if d == 0:
            LSE[bh] = mx[0] + T.log2(L[0])

    return paged_merge


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _build(func, arch):
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    with target:
        return tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")


def _prepare(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale, arch=None):
    heads = q.shape[1]
    page_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    assert q.shape[2] == D and heads % kv_heads == 0
    key = (heads, kv_heads, page_size, float(sm_scale))
    if key not in _COMPILED:
        group = heads // kv_heads
        a = arch or _arch()
        qscale = float(sm_scale) * math.log2(math.e)
        _COMPILED[key] = (_build(_make_partial(kv_heads, group, page_size, qscale), a),
                          _build(_make_merge(kv_heads, group, page_size), a))
    return list(_COMPILED[key])


def solve(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale):
    partial, merge = _prepare(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale)
    batch, heads, _ = q.shape
    page_size = k_cache.shape[1]
    nchunks = kv_indices.shape[0] * page_size // CH + batch   # bounds sum(ceil(len/CH)): no host sync
    npart = nchunks * WARPS * heads
    dev = q.device
    pm = torch.empty(npart, dtype=torch.float32, device=dev)
    pl = torch.empty(npart, dtype=torch.float32, device=dev)
    pacc = torch.empty(npart, D, dtype=torch.float32, device=dev)
    ptr, last = kv_indptr.contiguous(), kv_last_page_len.contiguous()
    partial(q.contiguous().view(-1, D), k_cache.contiguous().view(-1, D), v_cache.contiguous().view(-1, D), ptr,
            kv_indices.contiguous(), last, pm, pl, pacc)
    out = torch.empty(batch * heads, D, dtype=q.dtype, device=dev)
    lse = torch.empty(batch * heads, dtype=torch.float32, device=dev)
    merge(ptr, last, pm, pl, pacc, out, lse)
    return out.view(batch, heads, D), lse.view(batch, heads)
