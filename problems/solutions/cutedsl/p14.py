"""p14 absorbed MLA paged decode (page size 1, bf16) in CuTe DSL: chunked split-KV + merge kernel.

The token list is cut into chunks of CH tokens per sequence (work item = (sequence, chunk), found by a
scan of kv_indptr inside the kernel, so no host sync).  Kernel 1: a CTA of 256 threads per chunk,
16 threads per head (16 heads); a thread owns 32 of the 512 latent dims (8 x 4) and 4 of the 64 rope
dims, so every latent row it loads serves both the score and the output accumulation.  Scores are
summed over the 16 threads of a head with shuffles; online softmax in base 2 (q pre-scaled by
sm_scale*log2 e).  Kernel 2 merges a sequence's chunk partials per head: out, lse = M + log2 L.
"""
import math

import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

RANK, ROPE = 512, 64
CH = 256               # tokens per chunk
UNROLL = 2
NEG = -1.0e30
NK = RANK // 64        # latent 4-dim groups per thread (8)


class MlaPartial:
    def __init__(self, heads: int, qscale: float):
        self.H = heads
        self.qscale = qscale
        assert heads * 16 <= 1024

    @cute.jit
    def __call__(self, qn: cute.Tensor, qp: cute.Tensor, ckv: cute.Tensor, kpe: cute.Tensor, indptr: cute.Tensor,
                 indices: cute.Tensor, pm: cute.Tensor, pl: cute.Tensor, pacc: cute.Tensor, stream):
        nchunks = pm.shape[0] // self.H
        self.kernel(qn, qp, ckv, kpe, indptr, indices, pm, pl, pacc).launch(
            grid=[nchunks, 1, 1], block=[16 * self.H, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, qn: cute.Tensor, qp: cute.Tensor, ckv: cute.Tensor, kpe: cute.Tensor, indptr: cute.Tensor,
               indices: cute.Tensor, pm: cute.Tensor, pl: cute.Tensor, pacc: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        ci, _, _ = cute.arch.block_idx()
        h = tidx // 16
        ln = tidx % 16
        batch = indptr.shape[0] - 1
        # which (sequence, chunk) is work item ci
        cum = Int32(0)
        bsel = Int32(-1)
        csel = Int32(0)
        for bb in range(batch):
            n = (indptr[bb + 1] - indptr[bb] + CH - 1) // CH
            if bsel < 0:
                if ci < cum + n:
                    bsel = bb
                    csel = ci - cum
            cum = cum + n
        if bsel >= 0:
            t0 = indptr[bsel] + csel * CH
            t1 = cutlass.min(t0 + CH, indptr[bsel + 1])
            qrow = bsel * self.H + h
            rq = cute.make_rmem_tensor((4,), qn.element_type)
            qf = cute.make_rmem_tensor((4, NK + 1), Float32)
            for k in cutlass.range_constexpr(NK):
                cute.autovec_copy(cute.zipped_divide(qn[qrow, None], (4,))[None, k * 16 + ln], rq)
                for e in cutlass.range_constexpr(4):
                    qf[e, k] = rq[e].to(Float32) * self.qscale
            cute.autovec_copy(cute.zipped_divide(qp[qrow, None], (4,))[None, ln], rq)
            for e in cutlass.range_constexpr(4):
                qf[e, NK] = rq[e].to(Float32) * self.qscale
            acc = cute.make_rmem_tensor((4, NK), Float32)
            for k in cutlass.range_constexpr(NK):
                for e in cutlass.range_constexpr(4):
                    acc[e, k] = 0.0
            m = Float32(NEG)
            l = Float32(0.0)
            rc = cute.make_rmem_tensor((4, NK + 1, UNROLL), ckv.element_type)
            for i in range(t0, t1, UNROLL):
                for uu in cutlass.range_constexpr(UNROLL):
                    row = indices[cutlass.min(i + uu, t1 - 1)]
                    for k in cutlass.range_constexpr(NK):
                        cute.autovec_copy(cute.zipped_divide(ckv[row, None], (4,))[None, k * 16 + ln], rc[None, k, uu])
                    cute.autovec_copy(cute.zipped_divide(kpe[row, None], (4,))[None, ln], rc[None, NK, uu])
                for uu in cutlass.range_constexpr(UNROLL):
                    if i + uu < t1:
                        sc = Float32(0.0)
                        for k in cutlass.range_constexpr(NK + 1):
                            for e in cutlass.range_constexpr(4):
                                sc = sc + qf[e, k] * rc[e, k, uu].to(Float32)
                        for o in cutlass.range_constexpr(4):
                            sc = sc + cute.arch.shuffle_sync_bfly(sc, offset=1 << o)
                        m_new = cutlass.max(m, sc)
                        corr = cute.math.exp2(m - m_new, fastmath=True)
                        p = cute.math.exp2(sc - m_new, fastmath=True)
                        l = l * corr + p
                        for k in cutlass.range_constexpr(NK):
                            for e in cutlass.range_constexpr(4):
                                acc[e, k] = acc[e, k] * corr + p * rc[e, k, uu].to(Float32)
                        m = m_new
            prow = ci * self.H + h
            if ln == 0:
                pm[prow] = m
                pl[prow] = l
            for k in cutlass.range_constexpr(NK):
                for e in cutlass.range_constexpr(4):
                    pacc[prow, k * 64 + ln * 4 + e] = acc[e, k]


class MlaMerge:
    def __init__(self, heads: int):
        self.H = heads

    @cute.jit
    def __call__(self, indptr: cute.Tensor, pm: cute.Tensor, pl: cute.Tensor, pacc: cute.Tensor, out: cute.Tensor,
                 lse: cute.Tensor, stream):
        self.kernel(indptr, pm, pl, pacc, out, lse).launch(grid=[out.shape[0], 1, 1], block=[RANK // 4, 1, 1],
                                                           stream=stream)

    @cute.kernel
    def kernel(self, indptr: cute.Tensor, pm: cute.Tensor, pl: cute.Tensor, pacc: cute.Tensor, out: cute.Tensor,
               lse: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bh, _, _ = cute.arch.block_idx()
        b = bh // self.H
        h = bh % self.H
        c0 = Int32(0)
        for bb in range(b):
            c0 = c0 + (indptr[bb + 1] - indptr[bb] + CH - 1) // CH
        c1 = c0 + (indptr[b + 1] - indptr[b] + CH - 1) // CH
        M = Float32(NEG)
        for c in range(c0, c1):
            M = cutlass.max(M, pm[c * self.H + h])
        L = Float32(0.0)
        o = cute.make_rmem_tensor((4,), Float32)
        for e in cutlass.range_constexpr(4):
            o[e] = 0.0
        for c in range(c0, c1):
            w = cute.math.exp2(pm[c * self.H + h] - M, fastmath=True)
            L = L + pl[c * self.H + h] * w
            for e in cutlass.range_constexpr(4):
                o[e] = o[e] + pacc[c * self.H + h, tidx * 4 + e] * w
        ro = cute.make_rmem_tensor((4,), out.element_type)
        for e in cutlass.range_constexpr(4):
            ro[e] = (o[e] / L).to(out.element_type)
        cute.autovec_copy(ro, cute.zipped_divide(out[bh, None], (4,))[None, tidx])
        if tidx == 0:
            lse[bh] = M + cute.math.log2(L)


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _prepare(q_nope, q_pe, ckv_cache, kpe_cache, kv_indptr, kv_indices, sm_scale, arch=None):
    heads = q_nope.shape[1]
    assert q_nope.shape[2] == RANK and q_pe.shape[2] == ROPE
    key = (heads, float(sm_scale))
    if key not in _COMPILED:
        opts = f"--gpu-arch {arch or _arch()} --enable-tvm-ffi"
        bf = cutlass.BFloat16
        qr, pr, nb1, nt, npart = (cute.sym_int() for _ in range(5))
        stream = make_fake_stream(use_tvm_ffi_env_stream=True)
        mk = lambda dt, r, c: make_fake_compact_tensor(dt, (r, c), stride_order=(1, 0), assumed_align=16)  # noqa: E731
        fptr = make_fake_compact_tensor(Int32, (nb1,))
        fidx = make_fake_compact_tensor(Int32, (nt,))
        fpm = make_fake_compact_tensor(Float32, (npart,))
        qscale = float(sm_scale) * math.log2(math.e)
        partial = cute.compile(MlaPartial(heads, qscale), mk(bf, qr, RANK), mk(bf, qr, ROPE), mk(bf, pr, RANK),
                               mk(bf, pr, ROPE), fptr, fidx, fpm, fpm, mk(Float32, npart, RANK), stream, options=opts)
        merge = cute.compile(MlaMerge(heads), fptr, fpm, fpm, mk(Float32, npart, RANK), mk(bf, qr, RANK),
                             make_fake_compact_tensor(Float32, (qr,)), stream, options=opts)
        _COMPILED[key] = (partial, merge)
    return list(_COMPILED[key])


def solve(q_nope, q_pe, ckv_cache, kpe_cache, kv_indptr, kv_indices, sm_scale):
    partial, merge = _prepare(q_nope, q_pe, ckv_cache, kpe_cache, kv_indptr, kv_indices, sm_scale)
    batch, heads, _ = q_nope.shape
    nchunks = kv_indices.shape[0] // CH + batch          # upper bound on sum(ceil(len/CH)), no host sync
    dev = q_nope.device
    pm = torch.empty(nchunks * heads, dtype=torch.float32, device=dev)
    pl = torch.empty(nchunks * heads, dtype=torch.float32, device=dev)
    pacc = torch.empty(nchunks * heads, RANK, dtype=torch.float32, device=dev)
    qn = q_nope.contiguous().view(-1, RANK)
    partial(qn, q_pe.contiguous().view(-1, ROPE), ckv_cache.contiguous().view(-1, RANK),
            kpe_cache.contiguous().view(-1, ROPE),
            kv_indptr.contiguous(), kv_indices.contiguous(), pm, pl, pacc)
    out = torch.empty(batch * heads, RANK, dtype=q_nope.dtype, device=dev)
    lse = torch.empty(batch * heads, dtype=torch.float32, device=dev)
    merge(kv_indptr.contiguous(), pm, pl, pacc, out, lse)
    return out.view(batch, heads, RANK), lse.view(batch, heads)
