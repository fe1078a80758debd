"""p02 GQA paged decode (page size 1, bf16, 5 q heads : 1 kv head) in TIRx: split-KV flash decoding + merge.

Kernel 1: a CTA per (split, kv head, sequence), a warp per sub-split: the warp streams its tokens'
K and V rows (each lane 4 of the 128 dims, 8-byte loads, 4 tokens in flight), scores the 5 query heads
that share the kv head (warp shuffle sums), and keeps an online softmax in the base-2 domain (q is
pre-scaled by sm_scale*log2(e)).  It writes (m, l, acc) per sub-split.  Kernel 2 merges the NSUB
partials per (sequence, head): out = sum acc*2^(m-M) / L, lse = M + log2(L) (base-2 LSE).
"""
import math

import torch  # before tvm, so TVM's CUDA runtime finds the already-loaded CUDA libraries

import tvm
from tvm.script import tirx as T

D = 128
SPLITS = 8           # CTAs per (sequence, kv head): one kv head, so more splits fill the 132 SMs
WARPS = 4
NSUB = SPLITS * WARPS
UNROLL = 4
NEG = -1.0e30


def _make_partial(KVH: int, G: int, qscale: float):
    H = KVH * G

    @T.prim_func
    def decode_partial(q_h: T.handle, k_h: T.handle, v_h: T.handle, ptr_h: T.handle, idx_h: T.handle,
                       pm_h: T.handle, pl_h: T.handle, pacc_h: T.handle):
        qrows = T.int32()
        nb1 = T.int32()
        kr = T.int32()
        nt = T.int32()
        npart = T.int32()
        Q = T.match_buffer(q_h, (qrows, D), "bfloat16", align=16)
        K = T.match_buffer(k_h, (kr, D), "bfloat16", align=16)
        V = T.match_buffer(v_h, (kr, D), "bfloat16", align=16)
        PTR = T.match_buffer(ptr_h, (nb1,), "int32")
        IDX = T.match_buffer(idx_h, (nt,), "int32")
        PM = T.match_buffer(pm_h, (npart,), "float32")
        PL = T.match_buffer(pl_h, (npart,), "float32")
        PACC = T.match_buffer(pacc_h, (npart, D), "float32", align=16)
        T.device_entry()
        s, g, b = T.cta_id([SPLITS, KVH, nb1 - 1])
        tx = T.thread_id([32 * WARPS])
        rq = T.alloc_local((4,), "bfloat16")
        qf = T.alloc_local((G * 4,), "float32")
        m = T.alloc_local((G,), "float32")
        l = T.alloc_local((G,), "float32")
        acc = T.alloc_local((G * 4,), "float32")
        rk = T.alloc_local((UNROLL * 4,), "bfloat16")
        rv = T.alloc_local((UNROLL * 4,), "bfloat16")
        rows = T.alloc_local((UNROLL,), "int32")
        part = T.alloc_local((1,), "float32")
        lane: T.let = tx % 32
        u: T.let = s * WARPS + tx // 32
        start: T.let = PTR[b]
        length: T.let = PTR[b + 1] - start
        t0: T.let = start + (length * u) // NSUB
        t1: T.let = start + (length * (u + 1)) // NSUB
        for j in T.unroll(G):
            T.tile.copy(rq[:], Q[b * H + g * G + j, lane * 4:lane * 4 + 4])
            for e in T.unroll(4):
                qf[j * 4 + e] = T.Cast("float32", rq[e]) * T.float32(qscale)
            m[j] = T.float32(NEG)
            l[j] = T.float32(0)
            for e in T.unroll(4):
                acc[j * 4 + e] = T.float32(0)
        for it in T.serial(T.ceildiv(t1 - t0, UNROLL)):
            i: T.let = t0 + it * UNROLL
            for uu in T.unroll(UNROLL):
                rows[uu] = IDX[T.min(i + uu, t1 - 1)] * KVH + g
            for uu in T.unroll(UNROLL):
                T.tile.copy(rk[uu * 4:uu * 4 + 4], K[rows[uu], lane * 4:lane * 4 + 4])
                T.tile.copy(rv[uu * 4:uu * 4 + 4], V[rows[uu], lane * 4:lane * 4 + 4])
            for uu in T.unroll(UNROLL):
                if i + uu < t1:
                    for j in T.unroll(G):
                        part[0] = T.float32(0)
                        for e in T.unroll(4):
                            part[0] = part[0] + qf[j * 4 + e] * T.Cast("float32", rk[uu * 4 + e])
                        sc: T.float32 = T.cuda.warp_sum(part[0])
                        m_new: T.float32 = T.max(m[j], sc)
                        corr: T.float32 = T.exp2(m[j] - m_new)
                        p: T.float32 = T.exp2(sc - m_new)
                        l[j] = l[j] * corr + p
                        for e in T.unroll(4):
                            acc[j * 4 + e] = acc[j * 4 + e] * corr + p * T.Cast("float32", rv[uu * 4 + e])
                        m[j] = m_new
        base: T.let = (b * KVH + g) * NSUB + u
        for j in T.unroll(G):
            if lane == 0:
                PM[base * G + j] = m[j]
                PL[base * G + j] = l[j]
            for e in T.unroll(4):
                PACC[base * G + j, lane * 4 + e] = acc[j * 4 + e]

    return decode_partial


def _make_merge(KVH: int, G: int):
    H = KVH * G

    @T.prim_func
    def decode_merge(pm_h: T.handle, pl_h: T.handle, pacc_h: T.handle, out_h: T.handle, lse_h: T.handle):
        bh_total = T.int32()
        npart = T.int32()
        PM = T.match_buffer(pm_h, (npart,), "float32")
        PL = T.match_buffer(pl_h, (npart,), "float32")
        PACC = T.match_buffer(pacc_h, (npart, D), "float32", align=16)
        OUT = T.match_buffer(out_h, (bh_total, D), "bfloat16", align=16)
        LSE = T.match_buffer(lse_h, (bh_total,), "float32")
        T.device_entry()
        bh = T.cta_id([bh_total])
        d = T.thread_id([D])
        b: T.let = bh // H
        h: T.let = bh % H
        base: T.let = (b * KVH + h // G) * NSUB
        j: T.let = h % G
        mx = T.alloc_local((1,), "float32")
        L = T.alloc_local((1,), "float32")
        o = T.alloc_local((1,), "float32")
        mx[0] = T.float32(NEG)
        for u in T.unroll(NSUB):
            mx[0] = T.max(mx[0], PM[(base + u) * G + j])
        L[0] = T.float32(0)
        o[0] = T.float32(0)
        for u in T.unroll(NSUB):
            w: T.float32 = T.exp2(PM[(base + u) * G + j] - mx[0])
            L[0] = L[0] + PL[(base + u) * G + j] * w
            o[0] = o[0] + PACC[(base + u) * G + j, d] * w
        OUT[bh, d] = T.Cast("bfloat16", o[0] / L[0])
        if d == 0:
            LSE[bh] = mx[0] + T.log2(L[0])

    return decode_merge


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _build(func, arch):
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    with target:
        return tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")


def _prepare(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale, arch=None):
    heads, kv_heads = q.shape[1], k_cache.shape[2]
    assert q.shape[2] == D and k_cache.shape[1] == 1
    key = (heads, kv_heads, float(sm_scale))
    if key not in _COMPILED:
        group = heads // kv_heads
        a = arch or _arch()
        qscale = float(sm_scale) * math.log2(math.e)
        _COMPILED[key] = (_build(_make_partial(kv_heads, group, qscale), a), _build(_make_merge(kv_heads, group), a))
    return list(_COMPILED[key])


def solve(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale):
    partial, merge = _prepare(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale)
    batch, heads, _ = q.shape
    npart = batch * heads * NSUB
    pm = torch.empty(npart, dtype=torch.float32, device=q.device)
    pl = torch.empty(npart, dtype=torch.float32, device=q.device)
    pacc = torch.empty(npart, D, dtype=torch.float32, device=q.device)
    partial(q.contiguous().view(-1, D), k_cache.contiguous().view(-1, D), v_cache.contiguous().view(-1, D),
            kv_indptr.contiguous(), kv_indices.contiguous(), pm, pl, pacc)
    out = torch.empty(batch * heads, D, dtype=q.dtype, device=q.device)
    lse = torch.empty(batch * heads, dtype=torch.float32, device=q.device)
    merge(pm, pl, pacc, out, lse)
    return out.view(batch, heads, D), lse.view(batch, heads)
