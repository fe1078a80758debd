"""p01 GQA paged decode (page size 1, bf16) in TIRx: one launch, token-balanced split-KV + in-kernel merge.

The flattened token list (kv_indices, sequences back to back) is cut into chunks of CH tokens, whatever the
sequence boundaries: a CTA per (kv head, chunk) streams exactly CH tokens (the last chunk fewer), so the
grid is balanced by tokens. A chunk may hold the tail of one sequence and the head of the next: the CTA
finds its first sequence by a binary search of kv_indptr and walks the pieces (sequence ∩ chunk) in order.
Piece (chunk c, sequence b) writes its partial (m, l, acc) into slot c + b (c + b grows strictly along the
chunk/sequence staircase, so slots never collide; nchunks + batch bound them).

Per piece: four warps, two half-warp streams each (token t_lo + stream + 8 k); a lane holds 8 of the 128
dims (16-byte loads of the K and V rows), scores the 4 query heads of the kv head (8-term FMA chain + a
16-lane butterfly sum) and keeps an online softmax in base 2 (q pre-scaled by sm_scale * log2 e), updated
once per UNROLL tokens; the next step's page ids are loaded a step early. Halves merge by one xor-16
exchange, warps through shared memory; thread d writes dim d of the piece's 4 rows. Then a counter per
(sequence, kv head): the CTA that completes it (atomic add returns parts - 1) merges the sequence's
partials in chunk order (out = sum acc 2^(m-M) / L, lse = M + log2 L) and puts the counter back to 0.
"""
import math

import torch  # before tvm, so TVM's CUDA runtime finds the already-loaded CUDA libraries

import tvm
from tvm.script import tirx as T

D = 128
VEC = 8                      # dims per lane: one 16-byte load
HALF = D // VEC              # lanes per token (16)
WARPS = 4
STREAMS = 2 * WARPS          # half-warp token streams per CTA
CH = 256                     # tokens per chunk (per CTA)
UNROLL = 4                   # tokens in flight per stream
NEG = -1.0e30
FULL = 0xFFFFFFFF


def _steps(batch: int):
    """Descending powers of two for a branch-free binary search over batch sequences."""
    s = 1
    while s * 2 <= batch:
        s *= 2
    out = []
    while s >= 1:
        out.append(s)
        s //= 2
    return out


def _make_fused(B: int, KVH: int, G: int, qscale: float):
    H = KVH * G
    NSTEPS = len(_steps(B))

    @T.prim_func
    def decode_fused(q_h: T.handle, k_h: T.handle, v_h: T.handle, ptr_h: T.handle, idx_h: T.handle,
                     pm_h: T.handle, pl_h: T.handle, pacc_h: T.handle, cnt_h: T.handle, out_h: T.handle,
                     lse_h: T.handle):
        kr = T.int32()
        nt = T.int32()
        npart = T.int32()
        Q = T.match_buffer(q_h, (B * H, D), "bfloat16", align=16)
        K = T.match_buffer(k_h, (kr, D), "bfloat16", align=16)
        V = T.match_buffer(v_h, (kr, D), "bfloat16", align=16)
        PTR = T.match_buffer(ptr_h, (B + 1,), "int32")
        IDX = T.match_buffer(idx_h, (nt,), "int32")
        PM = T.match_buffer(pm_h, (npart,), "float32")
        PL = T.match_buffer(pl_h, (npart,), "float32")
        PACC = T.match_buffer(pacc_h, (npart, D), "float32", align=16)
        CNT = T.match_buffer(cnt_h, (B * KVH,), "int32")
        OUT = T.match_buffer(out_h, (B * H, D), "bfloat16", align=16)
        LSE = T.match_buffer(lse_h, (B * H,), "float32")
        T.device_entry()
        g, c = T.cta_id([KVH, T.ceildiv(nt, CH)])
        tx = T.thread_id([32 * WARPS])
        s_acc = T.alloc_buffer((WARPS * G * D,), "float32", scope="shared", align=16)
        s_ml = T.alloc_buffer((WARPS * G * 2,), "float32", scope="shared")
        s_flag = T.alloc_buffer((1,), "int32", scope="shared")
        st = T.alloc_local((2,), "int32")            # bb (current sequence), t_lo (current piece start)
        rq = T.alloc_local((VEC,), "bfloat16")
        qf = T.alloc_local((G * VEC,), "float32")
        m = T.alloc_local((G,), "float32")
        l = T.alloc_local((G,), "float32")
        acc = T.alloc_local((G * VEC,), "float32")
        rk = T.alloc_local((UNROLL * VEC,), "bfloat16")
        rv = T.alloc_local((UNROLL * VEC,), "bfloat16")
        pages = T.alloc_local((UNROLL,), "int32")
        sc = T.alloc_local((UNROLL * G,), "float32")
        part = T.alloc_local((1,), "float32")
        red = T.alloc_local((4,), "float32")         # M, L, A, mx
        warp: T.let = tx // 32
        half: T.let = (tx % 32) // HALF
        col = T.meta_var((tx % HALF) * VEC)
        strm: T.let = warp * 2 + half
        c_lo: T.let = c * CH
        c_hi: T.let = T.min(c_lo + CH, PTR[B])
        # the last sequence starting at or before c_lo (it holds token c_lo: empty sequences come before it)
        st[0] = 0
        for s in T.unroll(NSTEPS):
            if st[0] + T.shift_left(1, NSTEPS - 1 - s) < B:
                if PTR[st[0] + T.shift_left(1, NSTEPS - 1 - s)] <= c_lo:
                    st[0] = st[0] + T.shift_left(1, NSTEPS - 1 - s)
        st[1] = c_lo
        while st[1] < c_hi:
            bb: T.let = st[0]
            t_lo: T.let = st[1]
            p0: T.let = PTR[bb]
            p1: T.let = PTR[bb + 1]
            t_hi: T.let = T.min(p1, c_hi)
            if t_hi > t_lo:   # (an empty sequence gives no piece)
                cnt0: T.let = (t_hi - t_lo - warp * 2 + STREAMS - 1) // STREAMS   # half 0's count: warp-uniform
                for j in T.unroll(G):
                    T.tile.copy(rq[:], Q[bb * H + g * G + j, col:col + VEC])
                    for e in T.unroll(VEC):
                        qf[j * VEC + e] = T.Cast("float32", rq[e]) * T.float32(qscale)
                    m[j] = T.float32(NEG)
                    l[j] = T.float32(0)
                    for e in T.unroll(VEC):
                        acc[j * VEC + e] = T.float32(0)
                for uu in T.unroll(UNROLL):
                    pages[uu] = IDX[T.min(t_lo + strm + uu * STREAMS, t_hi - 1)]   # clamped: all lanes shuffle
                for it in T.serial(T.ceildiv(cnt0, UNROLL)):
                    for uu in T.unroll(UNROLL):
                        T.tile.copy(rk[uu * VEC:uu * VEC + VEC], K[pages[uu] * KVH + g, col:col + VEC])
                        T.tile.copy(rv[uu * VEC:uu * VEC + VEC], V[pages[uu] * KVH + g, col:col + VEC])
                    for uu in T.unroll(UNROLL):
                        pages[uu] = IDX[T.min(t_lo + strm + ((it + 1) * UNROLL + uu) * STREAMS, t_hi - 1)]
                    for uu in T.unroll(UNROLL):
                        for j in T.unroll(G):
                            part[0] = T.float32(0)
                            for e in T.unroll(VEC):
                                part[0] = part[0] + qf[j * VEC + e] * T.Cast("float32", rk[uu * VEC + e])
                            sc[uu * G + j] = T.cuda.warp_sum(part[0], HALF)
                    for j in T.unroll(G):
                        red[3] = m[j]
                        for uu in T.unroll(UNROLL):
                            if t_lo + strm + (it * UNROLL + uu) * STREAMS < t_hi:
                                red[3] = T.max(red[3], sc[uu * G + j])
                        corr: T.float32 = T.exp2(m[j] - red[3])
                        l[j] = l[j] * corr
                        for e in T.unroll(VEC):
                            acc[j * VEC + e] = acc[j * VEC + e] * corr
                        for uu in T.unroll(UNROLL):
                            if t_lo + strm + (it * UNROLL + uu) * STREAMS < t_hi:
                                p: T.float32 = T.exp2(sc[uu * G + j] - red[3])
                                l[j] = l[j] + p
                                for e in T.unroll(VEC):
                                    acc[j * VEC + e] = acc[j * VEC + e] + p * T.Cast("float32", rv[uu * VEC + e])
                        m[j] = red[3]
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
                if half == 0:
                    for j in T.unroll(G):
                        T.tile.copy(s_acc[(warp * G + j) * D + col:(warp * G + j) * D + col + VEC],
                                    acc[j * VEC:j * VEC + VEC])
                        if tx % HALF == 0:
                            s_ml[(warp * G + j) * 2] = m[j]
                            s_ml[(warp * G + j) * 2 + 1] = l[j]
                T.cuda.cta_sync()
                for j in T.unroll(G):
                    red[0] = s_ml[j * 2]
                    for w in T.unroll(1, WARPS):
                        red[0] = T.max(red[0], s_ml[(w * G + j) * 2])
                    red[1] = T.float32(0)
                    red[2] = T.float32(0)
                    for w in T.unroll(WARPS):
                        wt: T.float32 = T.exp2(s_ml[(w * G + j) * 2] - red[0])
                        red[1] = red[1] + s_ml[(w * G + j) * 2 + 1] * wt
                        red[2] = red[2] + s_acc[(w * G + j) * D + tx] * wt
                    PACC[((c + bb) * KVH + g) * G + j, tx] = red[2]
                    if tx == 0:
                        PM[((c + bb) * KVH + g) * G + j] = red[0]
                        PL[((c + bb) * KVH + g) * G + j] = red[1]
                T.cuda.thread_fence()
                T.cuda.cta_sync()
                first: T.let = p0 // CH
                parts: T.let = (p1 - 1) // CH - first + 1
                if tx == 0:
                    old: T.int32 = T.cuda.atomic_add(T.address_of(CNT[bb * KVH + g]), 1)
                    s_flag[0] = 0
                    if old == parts - 1:
                        s_flag[0] = 1
                        CNT[bb * KVH + g] = 0
                T.cuda.cta_sync()
                if s_flag[0] == 1:
                    T.cuda.thread_fence()
                    for j in T.unroll(G):
                        red[0] = T.float32(NEG)
                        for cc in T.serial(parts):
                            red[0] = T.max(red[0], PM[((first + cc + bb) * KVH + g) * G + j])
                        red[1] = T.float32(0)
                        red[2] = T.float32(0)
                        for cc in T.serial(parts):
                            wt2: T.float32 = T.exp2(PM[((first + cc + bb) * KVH + g) * G + j] - red[0])
                            red[1] = red[1] + PL[((first + cc + bb) * KVH + g) * G + j] * wt2
                            red[2] = red[2] + PACC[((first + cc + bb) * KVH + g) * G + j, tx] * wt2
                        OUT[bb * H + g * G + j, tx] = T.Cast("bfloat16", red[2] / red[1])
                        if tx == 0:
                            LSE[bb * H + g * G + j] = red[0] + T.log2(red[1])
                T.cuda.cta_sync()             # s_acc, s_ml and s_flag are reused by the next piece
            st[1] = t_hi
            st[0] = bb + 1

    return decode_fused


_COMPILED = {}
_SCRATCH = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _build(func, arch):
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    with target:
        return tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")


def _prepare(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale, arch=None):
    batch, heads = q.shape[0], q.shape[1]
    kv_heads = k_cache.shape[2]
    assert q.shape[2] == D and k_cache.shape[1] == 1 and heads % kv_heads == 0
    key = (batch, heads, kv_heads, float(sm_scale))
    if key not in _COMPILED:
        qscale = float(sm_scale) * math.log2(math.e)
        _COMPILED[key] = _build(_make_fused(batch, kv_heads, heads // kv_heads, qscale), arch or _arch())
    return [_COMPILED[key]]


def _scratch(device, nrows: int, ncnt: int):
    """Partials (rewritten before they are read, every call) and the counters (zero between calls: the
    merging CTA puts its counter back), allocated once per device and size."""
    key = (str(device), nrows, ncnt)
    if key not in _SCRATCH:
        _SCRATCH[key] = (torch.empty(nrows, dtype=torch.float32, device=device),
                         torch.empty(nrows, dtype=torch.float32, device=device),
                         torch.empty(nrows, D, dtype=torch.float32, device=device),
                         torch.zeros(ncnt, dtype=torch.int32, device=device))
    return _SCRATCH[key]


def solve(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale):
    fused, = _prepare(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale)
    batch, heads, _ = q.shape
    kv_heads = k_cache.shape[2]
    nrows = ((kv_indices.shape[0] + CH - 1) // CH + batch) * heads       # slots (chunk + sequence) x heads
    pm, pl, pacc, cnt = _scratch(q.device, nrows, batch * kv_heads)
    out = torch.empty(batch, heads, D, dtype=q.dtype, device=q.device)
    lse = torch.empty(batch, heads, dtype=torch.float32, device=q.device)
    fused(q.view(-1, D), k_cache.view(-1, D), v_cache.view(-1, D), kv_indptr, kv_indices, pm, pl, pacc, cnt,
          out.view(-1, D), lse.view(-1))
    return out, lse
