"""p02 GQA paged decode (page size 1, bf16, 5 q heads : 1 kv head) in CuTe DSL: split-KV flash decoding + merge.

Kernel 1: a CTA per (split, kv head, sequence), a warp per sub-split: the warp streams its tokens'
K and V rows (each lane 4 of the 128 dims, 8-byte loads, 4 tokens in flight), scores the 5 query heads
that share the kv head (warp shuffle sums), and keeps an online softmax in the base-2 domain (q is
pre-scaled by sm_scale*log2(e)).  It writes (m, l, acc) per sub-split.  Kernel 2 merges the NSUB
partials per (sequence, head): out = sum acc*2^(m-M) / L, lse = M + log2(L) (base-2 LSE).
"""
import math

import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

D = 128
SPLITS = 8           # CTAs per (sequence, kv head): one kv head, so more splits fill the 132 SMs
WARPS = 4            # sub-splits per CTA
NSUB = SPLITS * WARPS
UNROLL = 4
NEG = -1.0e30


class DecodePartial:
    def __init__(self, kv_heads: int, group: int, sm_scale: float):
        self.KVH, self.G = kv_heads, group
        self.qscale = sm_scale * math.log2(math.e)

    @cute.jit
    def __call__(self, q: cute.Tensor, kc: cute.Tensor, vc: cute.Tensor, indptr: cute.Tensor,
                 indices: cute.Tensor, pm: cute.Tensor, pl: cute.Tensor, pacc: cute.Tensor, stream):
        batch = indptr.shape[0] - 1
        self.kernel(q, kc, vc, indptr, indices, pm, pl, pacc).launch(
            grid=[SPLITS, self.KVH, batch], block=[32 * WARPS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, q: cute.Tensor, kc: cute.Tensor, vc: cute.Tensor, indptr: cute.Tensor,
               indices: cute.Tensor, pm: cute.Tensor, pl: cute.Tensor, pacc: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        s, g, b = cute.arch.block_idx()
        warp = tidx // 32
        lane = tidx % 32
        G = self.G
        start = indptr[b]
        length = indptr[b + 1] - start
        u = s * WARPS + warp
        t0 = start + (length * u) // NSUB
        t1 = start + (length * (u + 1)) // NSUB
        # q of the G heads of this kv head, this lane's 4 dims, pre-scaled (fp32)
        qf = cute.make_rmem_tensor((G, 4), Float32)
        rq = cute.make_rmem_tensor((4,), q.element_type)
        for j in cutlass.range_constexpr(G):
            cute.autovec_copy(cute.zipped_divide(q[b * self.KVH * G + g * G + j, None], (4,))[None, lane], rq)
            for e in cutlass.range_constexpr(4):
                qf[j, e] = rq[e].to(Float32) * self.qscale
        m = cute.make_rmem_tensor((G,), Float32)
        l = cute.make_rmem_tensor((G,), Float32)
        acc = cute.make_rmem_tensor((G, 4), Float32)
        for j in cutlass.range_constexpr(G):
            m[j] = NEG
            l[j] = 0.0
            for e in cutlass.range_constexpr(4):
                acc[j, e] = 0.0
        rk = cute.make_rmem_tensor((4, UNROLL), kc.element_type)   # column-major: rk[None, uu] is contiguous
        rv = cute.make_rmem_tensor((4, UNROLL), vc.element_type)
        for i in range(t0, t1, UNROLL):
            for uu in cutlass.range_constexpr(UNROLL):
                tok = cutlass.min(i + uu, t1 - 1)
                row = indices[tok] * self.KVH + g
                cute.autovec_copy(cute.zipped_divide(kc[row, None], (4,))[None, lane], rk[None, uu])
                cute.autovec_copy(cute.zipped_divide(vc[row, None], (4,))[None, lane], rv[None, uu])
            for uu in cutlass.range_constexpr(UNROLL):
                if i + uu < t1:
                    for j in cutlass.range_constexpr(G):
                        sc = Float32(0.0)
                        for e in cutlass.range_constexpr(4):
                            sc = sc + qf[j, e] * rk[e, uu].to(Float32)
                        sc = cute.arch.warp_reduction_sum(sc)
                        m_new = cutlass.max(m[j], sc)
                        corr = cute.math.exp2(m[j] - m_new, fastmath=True)
                        p = cute.math.exp2(sc - m_new, fastmath=True)
                        l[j] = l[j] * corr + p
                        for e in cutlass.range_constexpr(4):
                            acc[j, e] = acc[j, e] * corr + p * rv[e, uu].to(Float32)
                        m[j] = m_new
        base = (b * self.KVH + g) * NSUB + u
        for j in cutlass.range_constexpr(G):
            if lane == 0:
                pm[base * G + j] = m[j]
                pl[base * G + j] = l[j]
            for e in cutlass.range_constexpr(4):
                pacc[base * G + j, lane * 4 + e] = acc[j, e]


class DecodeMerge:
    def __init__(self, kv_heads: int, group: int):
        self.KVH, self.G = kv_heads, group

    @cute.jit
    def __call__(self, pm: cute.Tensor, pl: cute.Tensor, pacc: cute.Tensor, out: cute.Tensor,
                 lse: cute.Tensor, stream):
        self.kernel(pm, pl, pacc, out, lse).launch(grid=[out.shape[0], 1, 1], block=[D, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, pm: cute.Tensor, pl: cute.Tensor, pacc: cute.Tensor, out: cute.Tensor, lse: cute.Tensor):
        d, _, _ = cute.arch.thread_idx()
        bh, _, _ = cute.arch.block_idx()           # b * heads + h
        G = self.G
        heads = self.KVH * G
        b = bh // heads
        h = bh % heads
        g = h // G
        j = h % G
        base = (b * self.KVH + g) * NSUB
        M = Float32(NEG)
        for u in cutlass.range_constexpr(NSUB):
            M = cutlass.max(M, pm[(base + u) * G + j])
        L = Float32(0.0)
        o = Float32(0.0)
        for u in cutlass.range_constexpr(NSUB):
            w = cute.math.exp2(pm[(base + u) * G + j] - M, fastmath=True)
            L = L + pl[(base + u) * G + j] * w
            o = o + pacc[(base + u) * G + j, d] * w
        out[bh, d] = (o / L).to(out.element_type)
        if d == 0:
            lse[bh] = M + cute.math.log2(L)


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _prepare(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale, arch=None):
    heads = q.shape[1]
    kv_heads = k_cache.shape[2]
    assert q.shape[2] == D and k_cache.shape[1] == 1
    key = (heads, kv_heads, float(sm_scale))
    if key not in _COMPILED:
        group = heads // kv_heads
        opts = f"--gpu-arch {arch or _arch()} --enable-tvm-ffi"
        bf = cutlass.BFloat16
        qr, kr, nb1, nt, npart = (cute.sym_int() for _ in range(5))
        stream = make_fake_stream(use_tvm_ffi_env_stream=True)
        rows2 = lambda dt, r: make_fake_compact_tensor(dt, (r, D), stride_order=(1, 0), assumed_align=16)  # noqa: E731
        fq, fk = rows2(bf, qr), rows2(bf, kr)
        fptr = make_fake_compact_tensor(Int32, (nb1,))
        fidx = make_fake_compact_tensor(Int32, (nt,))
        fpm = make_fake_compact_tensor(Float32, (npart,))
        fpacc = rows2(Float32, npart)
        partial = cute.compile(DecodePartial(kv_heads, group, float(sm_scale)), fq, fk, fk, fptr, fidx,
                               fpm, fpm, fpacc, stream, options=opts)
        flse = make_fake_compact_tensor(Float32, (qr,))
        merge = cute.compile(DecodeMerge(kv_heads, group), fpm, fpm, fpacc, fq, flse, stream, options=opts)
        _COMPILED[key] = (partial, merge)
    return list(_COMPILED[key])


def solve(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale):
    partial, merge = _prepare(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale)
    batch, heads, _ = q.shape
    kv_heads = k_cache.shape[2]
    npart = batch * heads * NSUB
    pm = torch.empty(npart, dtype=torch.float32, device=q.device)
    pl = torch.empty(npart, dtype=torch.float32, device=q.device)
    pacc = torch.empty(npart, D, dtype=torch.float32, device=q.device)
    q2 = q.contiguous().view(-1, D)
    partial(q2, k_cache.contiguous().view(-1, D), v_cache.contiguous().view(-1, D), kv_indptr.contiguous(),
            kv_indices.contiguous(), pm, pl, pacc)
    out = torch.empty(batch * heads, D, dtype=q.dtype, device=q.device)
    lse = torch.empty(batch * heads, dtype=torch.float32, device=q.device)
    merge(pm, pl, pacc, out, lse)
    return out.view(batch, heads, D), lse.view(batch, heads)
