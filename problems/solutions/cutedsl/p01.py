"""p01 GQA paged decode (page size 1, bf16) in CuTe DSL: one launch, token-balanced split-KV + in-kernel merge.

The flattened token list (kv_indices, sequences back to back) is cut into chunks of CH tokens, whatever the
sequence boundaries: a CTA per (kv head, chunk) streams exactly CH tokens (the last chunk fewer), so the
grid is balanced by tokens. A chunk may hold the tail of one sequence and the head of the next: the CTA
finds its first sequence by a binary search of kv_indptr and walks the pieces (sequence ∩ chunk) in order.
Piece (chunk c, sequence b) writes its partial (m, l, acc) into slot c + b (c + b grows strictly along the
chunk/sequence staircase, so slots never collide; nchunks + batch bound them).

Per piece: four warps, two half-warp streams each (token t_lo + stream + 8 k); a lane holds 8 of the 128
dims (16-byte loads of the K and V rows), scores the 4 query heads of the kv head (8-term FMA chain + 4
butterfly shuffles in the half-warp) and keeps an online softmax in base 2 (q pre-scaled by
sm_scale * log2 e), updated once per UNROLL tokens. Halves merge by one xor-16 exchange, warps through
shared memory; thread d writes dim d of the piece's 4 rows. Then a counter per (sequence, kv head): the CTA
that completes it (atomic add returns parts - 1) merges the sequence's partials in chunk order
(out = sum acc 2^(m-M) / L, lse = M + log2 L) and puts the counter back to 0 for the next call.
"""
import math

import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

D = 128
VEC = 8                      # dims per lane: one 16-byte load
HALF = D // VEC              # lanes per token (16)
WARPS = 4
STREAMS = 2 * WARPS          # half-warp token streams per CTA
CH = 256                     # tokens per chunk (per CTA)
UNROLL = 4                   # tokens in flight per stream
NEG = -1.0e30


class DecodeFused:
    def __init__(self, kv_heads: int, group: int, batch: int, qscale: float):
        self.KVH, self.G, self.B = kv_heads, group, batch
        self.qscale = qscale
        self.steps = []
        s = 1
        while s * 2 <= batch:
            s *= 2
        while s >= 1:
            self.steps.append(s)
            s //= 2

    @cute.jit
    def __call__(self, q: cute.Tensor, kc: cute.Tensor, vc: cute.Tensor, indptr: cute.Tensor,
                 indices: cute.Tensor, pm: cute.Tensor, pl: cute.Tensor, pacc: cute.Tensor, cnt: cute.Tensor,
                 out: cute.Tensor, lse: cute.Tensor, stream):
        nchunks = (indices.shape[0] + CH - 1) // CH
        self.kernel(q, kc, vc, indptr, indices, pm, pl, pacc, cnt, out, lse).launch(
            grid=[self.KVH, nchunks, 1], block=[32 * WARPS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, q: cute.Tensor, kc: cute.Tensor, vc: cute.Tensor, indptr: cute.Tensor,
               indices: cute.Tensor, pm: cute.Tensor, pl: cute.Tensor, pacc: cute.Tensor, cnt: cute.Tensor,
               out: cute.Tensor, lse: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        g, c, _ = cute.arch.block_idx()
        warp = tidx // 32
        half = (tidx % 32) // HALF
        ln = tidx % HALF
        strm = warp * 2 + half
        G, KVH, B = self.G, self.KVH, self.B
        alloc = cutlass.memory.SmemAllocator()
        s_acc = alloc.allocate_tensor(Float32, cute.make_layout((D, G, WARPS), stride=(1, D, D * G)),
                                      byte_alignment=16)
        s_ml = alloc.allocate_tensor(Float32, cute.make_layout((2, G, WARPS), stride=(1, 2, 2 * G)),
                                     byte_alignment=16)
        s_flag = alloc.allocate_tensor(Int32, cute.make_layout(1))
        total = indptr[B]
        c_lo = c * CH
        c_hi = cutlass.min(c_lo + CH, total)
        # the last sequence starting at or before c_lo (it holds token c_lo: empty sequences come before it)
        bb = Int32(0)
        for s in cutlass.range_constexpr(len(self.steps)):
            st = self.steps[s]
            if bb + st < B:
                if indptr[bb + st] <= c_lo:
                    bb = bb + st
        t_lo = c_lo
        while t_lo < c_hi:
            p0 = indptr[bb]
            p1 = indptr[bb + 1]
            t_hi = cutlass.min(p1, c_hi)
            n = t_hi - t_lo
            if n > 0:   # (an empty sequence gives no piece)
                cnt0 = (n - warp * 2 + STREAMS - 1) // STREAMS          # half 0's count, the larger: warp-uniform
                qf = cute.make_rmem_tensor((VEC, G), Float32)
                rq = cute.make_rmem_tensor((VEC,), q.element_type)
                for j in cutlass.range_constexpr(G):
                    cute.autovec_copy(cute.zipped_divide(q[bb * KVH * G + g * G + j, None], (VEC,))[None, ln], rq)
                    for e in cutlass.range_constexpr(VEC):
                        qf[e, j] = rq[e].to(Float32) * self.qscale
                m = cute.make_rmem_tensor((G,), Float32)
                l = cute.make_rmem_tensor((G,), Float32)
                acc = cute.make_rmem_tensor((VEC, G), Float32)
                for j in cutlass.range_constexpr(G):
                    m[j] = NEG
                    l[j] = 0.0
                    for e in cutlass.range_constexpr(VEC):
                        acc[e, j] = 0.0
                rk = cute.make_rmem_tensor((VEC, UNROLL), kc.element_type)   # rk[None, u] is contiguous
                rv = cute.make_rmem_tensor((VEC, UNROLL), vc.element_type)
                sc = cute.make_rmem_tensor((UNROLL, G), Float32)
                pages = cute.make_rmem_tensor((UNROLL,), Int32)      # the next step's page ids, loaded a step early
                for uu in cutlass.range_constexpr(UNROLL):
                    pages[uu] = indices[cutlass.min(t_lo + strm + uu * STREAMS, t_hi - 1)]   # clamped: all lanes shuffle
                for it in range(0, cnt0, UNROLL):
                    for uu in cutlass.range_constexpr(UNROLL):
                        row = pages[uu] * KVH + g
                        cute.autovec_copy(cute.zipped_divide(kc[row, None], (VEC,))[None, ln], rk[None, uu])
                        cute.autovec_copy(cute.zipped_divide(vc[row, None], (VEC,))[None, ln], rv[None, uu])
                    for uu in cutlass.range_constexpr(UNROLL):
                        pages[uu] = indices[cutlass.min(t_lo + strm + (it + UNROLL + uu) * STREAMS, t_hi - 1)]
                    for uu in cutlass.range_constexpr(UNROLL):
                        for j in cutlass.range_constexpr(G):
                            s_ = Float32(0.0)
                            for e in cutlass.range_constexpr(VEC):
                                s_ = s_ + qf[e, j] * rk[e, uu].to(Float32)
                            for o in cutlass.range_constexpr(4):
                                s_ = s_ + cute.arch.shuffle_sync_bfly(s_, offset=1 << o)
                            sc[uu, j] = s_
                    for j in cutlass.range_constexpr(G):
                        mx = m[j]
                        for uu in cutlass.range_constexpr(UNROLL):
                            if t_lo + strm + (it + uu) * STREAMS < t_hi:
                                mx = cutlass.max(mx, sc[uu, j])
                        corr = cute.math.exp2(m[j] - mx, fastmath=True)
                        lj = l[j] * corr
                        for e in cutlass.range_constexpr(VEC):
                            acc[e, j] = acc[e, j] * corr
                        for uu in cutlass.range_constexpr(UNROLL):
                            p = Float32(0.0)
                            if t_lo + strm + (it + uu) * STREAMS < t_hi:
                                p = cute.math.exp2(sc[uu, j] - mx, fastmath=True)
                            lj = lj + p
                            for e in cutlass.range_constexpr(VEC):
                                acc[e, j] = acc[e, j] + p * rv[e, uu].to(Float32)
                        l[j] = lj
                        m[j] = mx
                # the two half-warp streams hold the same dims: merge them with one xor-16 exchange
                for j in cutlass.range_constexpr(G):
                    mo = cute.arch.shuffle_sync_bfly(m[j], offset=16)
                    lo = cute.arch.shuffle_sync_bfly(l[j], offset=16)
                    mx2 = cutlass.max(m[j], mo)
                    wa = cute.math.exp2(m[j] - mx2, fastmath=True)
                    wb = cute.math.exp2(mo - mx2, fastmath=True)
                    l[j] = l[j] * wa + lo * wb
                    for e in cutlass.range_constexpr(VEC):
                        acc[e, j] = acc[e, j] * wa + cute.arch.shuffle_sync_bfly(acc[e, j], offset=16) * wb
                    m[j] = mx2
                if half == 0:
                    for j in cutlass.range_constexpr(G):
                        cute.autovec_copy(acc[None, j], cute.zipped_divide(s_acc[None, j, warp], (VEC,))[None, ln])
                        if ln == 0:
                            s_ml[0, j, warp] = m[j]
                            s_ml[1, j, warp] = l[j]
                cute.arch.sync_threads()
                slot = c + bb
                for j in cutlass.range_constexpr(G):
                    M = s_ml[0, j, 0]
                    for w in cutlass.range_constexpr(1, WARPS):
                        M = cutlass.max(M, s_ml[0, j, w])
                    L = Float32(0.0)
                    A = Float32(0.0)
                    for w in cutlass.range_constexpr(WARPS):
                        wt = cute.math.exp2(s_ml[0, j, w] - M, fastmath=True)
                        L = L + s_ml[1, j, w] * wt
                        A = A + s_acc[tidx, j, w] * wt
                    prow = (slot * KVH + g) * G + j
                    pacc[prow, tidx] = A
                    if tidx == 0:
                        pm[prow] = M
                        pl[prow] = L
                cute.arch.fence_acq_rel_gpu()
                cute.arch.sync_threads()
                first = p0 // CH
                parts = (p1 - 1) // CH - first + 1
                if tidx == 0:
                    old = cute.arch.atomic_add(cnt.iterator + (bb * KVH + g), Int32(1), sem="acq_rel", scope="gpu")
                    s_flag[0] = Int32(0)
                    if old == parts - 1:
                        s_flag[0] = Int32(1)
                        cnt[bb * KVH + g] = Int32(0)
                cute.arch.sync_threads()
                if s_flag[0] == 1:
                    cute.arch.fence_acq_rel_gpu()
                    for j in cutlass.range_constexpr(G):
                        M = Float32(NEG)
                        for cc in range(first, first + parts):
                            M = cutlass.max(M, pm[((cc + bb) * KVH + g) * G + j])
                        L = Float32(0.0)
                        A = Float32(0.0)
                        for cc in range(first, first + parts):
                            prow = ((cc + bb) * KVH + g) * G + j
                            wt = cute.math.exp2(pm[prow] - M, fastmath=True)
                            L = L + pl[prow] * wt
                            A = A + pacc[prow, tidx] * wt
                        orow = bb * KVH * G + g * G + j
                        out[orow, tidx] = (A / L).to(out.element_type)
                        if tidx == 0:
                            lse[orow] = M + cute.math.log2(L)
                cute.arch.sync_threads()           # s_acc, s_ml and s_flag are reused by the next piece
            t_lo = t_hi
            bb = bb + 1


_COMPILED = {}
_SCRATCH = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _prepare(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale, arch=None):
    batch, heads = q.shape[0], q.shape[1]
    kv_heads = k_cache.shape[2]
    assert q.shape[2] == D and k_cache.shape[1] == 1 and heads % kv_heads == 0
    key = (batch, heads, kv_heads, float(sm_scale))
    if key not in _COMPILED:
        group = heads // kv_heads
        opts = f"--gpu-arch {arch or _arch()} --enable-tvm-ffi"
        bf = cutlass.BFloat16
        kr, nt, npart = (cute.sym_int() for _ in range(3))
        stream = make_fake_stream(use_tvm_ffi_env_stream=True)
        rows2 = lambda dt, r: make_fake_compact_tensor(dt, (r, D), stride_order=(1, 0), assumed_align=16)  # noqa: E731
        fk = rows2(bf, kr)
        fq = rows2(bf, batch * heads)
        fptr = make_fake_compact_tensor(Int32, (batch + 1,))
        fidx = make_fake_compact_tensor(Int32, (nt,))
        fpm = make_fake_compact_tensor(Float32, (npart,))
        fcnt = make_fake_compact_tensor(Int32, (batch * kv_heads,))
        flse = make_fake_compact_tensor(Float32, (batch * heads,))
        qscale = float(sm_scale) * math.log2(math.e)
        _COMPILED[key] = cute.compile(DecodeFused(kv_heads, group, batch, qscale), fq, fk, fk, fptr, fidx, fpm, fpm,
                                      rows2(Float32, npart), fcnt, fq, flse, stream, options=opts)
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
