"""p03 GQA paged decode (page size 64, bf16) in CuTe DSL: chunked split-KV flash decoding + merge.

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

import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

D = 128
VEC = 8                      # dims per lane: one 16-byte load
HALF = D // VEC              # lanes per token (16)
WARPS = 4
CH = 2048                    # tokens per chunk
SUB = CH // (2 * WARPS)      # tokens per half-warp stream
UNROLL = 4
NEG = -1.0e30


def _seq_len(indptr, last, b, page_size: int):
    """Tokens of sequence b: (pages - 1) * page_size + last page length (0 without pages); traced inline."""
    npg = indptr[b + 1] - indptr[b]
    return cutlass.max(npg - 1, 0) * page_size + cutlass.min(npg, 1) * last[b]


class PagedPartial:
    def __init__(self, kv_heads: int, group: int, page_size: int, qscale: float):
        self.KVH, self.G, self.PS = kv_heads, group, page_size
        self.qscale = qscale

    @cute.jit
    def __call__(self, q: cute.Tensor, kc: cute.Tensor, vc: cute.Tensor, indptr: cute.Tensor,
                 indices: cute.Tensor, last: cute.Tensor, pm: cute.Tensor, pl: cute.Tensor,
                 pacc: cute.Tensor, stream):
        nchunks = pm.shape[0] // (self.KVH * WARPS * self.G)
        self.kernel(q, kc, vc, indptr, indices, last, pm, pl, pacc).launch(
            grid=[nchunks, self.KVH, 1], block=[32 * WARPS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, q: cute.Tensor, kc: cute.Tensor, vc: cute.Tensor, indptr: cute.Tensor,
               indices: cute.Tensor, last: cute.Tensor, pm: cute.Tensor, pl: cute.Tensor, pacc: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        ci, g, _ = cute.arch.block_idx()
        warp = tidx // 32
        half = (tidx % 32) // HALF
        ln = tidx % HALF
        G, PS, KVH = self.G, self.PS, self.KVH
        batch = indptr.shape[0] - 1
        cum = Int32(0)
        bsel = Int32(-1)
        csel = Int32(0)
        for bb in range(batch):
            n = (_seq_len(indptr, last, bb, PS) + CH - 1) // CH
            if bsel < 0:
                if ci < cum + n:
                    bsel = bb
                    csel = ci - cum
            cum = cum + n
        if bsel >= 0:
            p0 = indptr[bsel]
            slen = _seq_len(indptr, last, bsel, PS)
            t_lo = csel * CH + 2 * warp * SUB
            cnt = cutlass.min(cutlass.max(slen - t_lo, 0), SUB)     # half 0's count, the larger: warp-uniform
            s0 = t_lo + half * SUB
            s1 = cutlass.min(s0 + SUB, slen)
            qf = cute.make_rmem_tensor((VEC, G), Float32)
            rq = cute.make_rmem_tensor((VEC,), q.element_type)
            for j in cutlass.range_constexpr(G):
                cute.autovec_copy(cute.zipped_divide(q[bsel * KVH * G + g * G + j, None], (VEC,))[None, ln], rq)
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
            for i in range(0, cnt, UNROLL):
                for uu in cutlass.range_constexpr(UNROLL):
                    tok = cutlass.min(s0 + i + uu, slen - 1)     # clamped: every lane loads and shuffles
                    row = (indices[p0 + tok // PS] * PS + tok % PS) * KVH + g
                    cute.autovec_copy(cute.zipped_divide(kc[row, None], (VEC,))[None, ln], rk[None, uu])
                    cute.autovec_copy(cute.zipped_divide(vc[row, None], (VEC,))[None, ln], rv[None, uu])
                for uu in cutlass.range_constexpr(UNROLL):
                    for j in cutlass.range_constexpr(G):
                        sc = Float32(0.0)
                        for e in cutlass.range_constexpr(VEC):
                            sc = sc + qf[e, j] * rk[e, uu].to(Float32)
                        for o in cutlass.range_constexpr(4):
                            sc = sc + cute.arch.shuffle_sync_bfly(sc, offset=1 << o)
                        if s0 + i + uu < s1:
                            m_new = cutlass.max(m[j], sc)
                            corr = cute.math.exp2(m[j] - m_new, fastmath=True)
                            p = cute.math.exp2(sc - m_new, fastmath=True)
                            l[j] = l[j] * corr + p
                            for e in cutlass.range_constexpr(VEC):
                                acc[e, j] = acc[e, j] * corr + p * rv[e, uu].to(Float32)
                            m[j] = m_new
            # the two half-warp streams hold the same dims: merge them with one xor-16 exchange
            for j in cutlass.range_constexpr(G):
                mo = cute.arch.shuffle_sync_bfly(m[j], offset=16)
                lo = cute.arch.shuffle_sync_bfly(l[j], offset=16)
                mx = cutlass.max(m[j], mo)
                wa = cute.math.exp2(m[j] - mx, fastmath=True)
                wb = cute.math.exp2(mo - mx, fastmath=True)
                l[j] = l[j] * wa + lo * wb
                for e in cutlass.range_constexpr(VEC):
                    acc[e, j] = acc[e, j] * wa + cute.arch.shuffle_sync_bfly(acc[e, j], offset=16) * wb
                m[j] = mx
            base = ((ci * KVH + g) * WARPS + warp) * G
            if half == 0:
                for j in cutlass.range_constexpr(G):
                    if ln == 0:
                        pm[base + j] = m[j]
                        pl[base + j] = l[j]
                    cute.autovec_copy(acc[None, j], cute.zipped_divide(pacc[base + j, None], (VEC,))[None, ln])


class PagedMerge:
    def __init__(self, kv_heads: int, group: int, page_size: int):
        self.KVH, self.G, self.PS = kv_heads, group, page_size

    @cute.jit
    def __call__(self, indptr: cute.Tensor, last: cute.Tensor, pm: cute.Tensor, pl: cute.Tensor,
                 pacc: cute.Tensor, out: cute.Tensor, lse: cute.Tensor, stream):
        self.kernel(indptr, last, pm, pl, pacc, out, lse).launch(grid=[out.shape[0], 1, 1], block=[D, 1, 1],
                                                                 stream=stream)

    @cute.kernel
    def kernel(self, indptr: cute.Tensor, last: cute.Tensor, pm: cute.Tensor, pl: cute.Tensor, pacc: cute.Tensor,
               out: cute.Tensor, lse: cute.Tensor):
        d, _, _ = cute.arch.thread_idx()
        bh, _, _ = cute.arch.block_idx()           # b * heads + h
        G, KVH = self.G, self.KVH
        b = bh // (KVH * G)
        g = (bh % (KVH * G)) // G
        j = bh % G
        c0 = Int32(0)
        for bb in range(b):
            c0 = c0 + (_seq_len(indptr, last, bb, self.PS) + CH - 1) // CH
        c1 = c0 + (_seq_len(indptr, last, b, self.PS) + CH - 1) // CH
        M = Float32(NEG)
        for c in range(c0, c1):
            for w in cutlass.range_constexpr(WARPS):
                M = cutlass.max(M, pm[((c * KVH + g) * WARPS + w) * G + j])
        L = Float32(0.0)
        o = Float32(0.0)
        for c in range(c0, c1):
            for w in cutlass.range_constexpr(WARPS):
                idx = ((c * KVH + g) * WARPS + w) * G + j
                wt = cute.math.exp2(pm[idx] - M, fastmath=True)
                L = L + pl[idx] * wt
                o = o + pacc[idx, d] * wt
        out[bh, d] = (o / L).to(out.element_type)
        if d == 0:
            lse[bh] = M + cute.math.log2(L)


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _prepare(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale, arch=None):
    heads = q.shape[1]
    page_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    assert q.shape[2] == D and heads % kv_heads == 0
    key = (heads, kv_heads, page_size, float(sm_scale))
    if key not in _COMPILED:
        group = heads // kv_heads
        opts = f"--gpu-arch {arch or _arch()} --enable-tvm-ffi"
        bf = cutlass.BFloat16
        qr, kr, nb1, nb, nt, npart = (cute.sym_int() for _ in range(6))
        stream = make_fake_stream(use_tvm_ffi_env_stream=True)
        rows2 = lambda dt, r: make_fake_compact_tensor(dt, (r, D), stride_order=(1, 0), assumed_align=16)  # noqa: E731
        fptr = make_fake_compact_tensor(Int32, (nb1,))
        fidx = make_fake_compact_tensor(Int32, (nt,))
        flast = make_fake_compact_tensor(Int32, (nb,))
        fpm = make_fake_compact_tensor(Float32, (npart,))
        qscale = float(sm_scale) * math.log2(math.e)
        partial = cute.compile(PagedPartial(kv_heads, group, page_size, qscale), rows2(bf, qr), rows2(bf, kr),
                               rows2(bf, kr), fptr, fidx, flast, fpm, fpm, rows2(Float32, npart), stream,
                               options=opts)
        merge = cute.compile(PagedMerge(kv_heads, group, page_size), fptr, flast, fpm, fpm, rows2(Float32, npart),
                             rows2(bf, qr), make_fake_compact_tensor(Float32, (qr,)), stream, options=opts)
        _COMPILED[key] = (partial, merge)
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
