"""p15 causal absorbed-MLA paged prefill (page size 1, 16 heads, latent 512 + rope 64, bf16) in CuTe DSL: a warp per (query, 4 heads).

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

import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

DC = 512               # latent (ckv) dims: K and V
DP = 64                # rope (kpe) dims: K only
VC, VP = DC // 32, DP // 32
R = 4                  # heads per warp: 4 heads share each latent row load
WARPS = 4
UNROLL = 2
NEG = -1.0e30


class MlaPagedPrefill:
    def __init__(self, heads: int, qscale: float):
        self.H = heads
        self.qscale = qscale

    @cute.jit
    def __call__(self, qn: cute.Tensor, qp: cute.Tensor, ckv: cute.Tensor, kpe: cute.Tensor, qo: cute.Tensor,
                 kv: cute.Tensor, idx: cute.Tensor, out: cute.Tensor, lse: cute.Tensor, stream):
        ntiles = qn.shape[0] // self.H                                     # one tile per query
        self.kernel(qn, qp, ckv, kpe, qo, kv, idx, out, lse).launch(
            grid=[(ntiles + WARPS - 1) // WARPS, self.H // R, 1], block=[32 * WARPS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, qn: cute.Tensor, qp: cute.Tensor, ckv: cute.Tensor, kpe: cute.Tensor, qo: cute.Tensor,
               kv: cute.Tensor, idx: cute.Tensor, out: cute.Tensor, lse: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bx, hg, _ = cute.arch.block_idx()
        lane = tidx % 32
        rtile = bx * WARPS + tidx // 32              # queries counted from the last one (see the scan)
        H = self.H
        batch = qo.shape[0] - 1
        cum = Int32(0)
        bsel = Int32(-1)
        isel = Int32(0)
        for bi in range(batch):
            bb = batch - 1 - bi
            n = qo[bb + 1] - qo[bb]
            if bsel < 0:
                if rtile < cum + n:
                    bsel = bb
                    isel = n - 1 - (rtile - cum)
            cum = cum + n
        if bsel >= 0:
            qlen = qo[bsel + 1] - qo[bsel]
            p0 = kv[bsel]
            kend = isel + kv[bsel + 1] - p0 - qlen + 1     # the query sees keys [0, kend)
            qc = cute.make_rmem_tensor((VC, R), Float32)
            qr = cute.make_rmem_tensor((VP, R), Float32)
            rqc = cute.make_rmem_tensor((VC,), qn.element_type)
            rqp = cute.make_rmem_tensor((VP,), qp.element_type)
            for r in cutlass.range_constexpr(R):
                qrow = (qo[bsel] + isel) * H + hg * R + r
                cute.autovec_copy(cute.zipped_divide(qn[qrow, None], (VC,))[None, lane], rqc)
                cute.autovec_copy(cute.zipped_divide(qp[qrow, None], (VP,))[None, lane], rqp)
                for e in cutlass.range_constexpr(VC):
                    qc[e, r] = rqc[e].to(Float32) * self.qscale
                for e in cutlass.range_constexpr(VP):
                    qr[e, r] = rqp[e].to(Float32) * self.qscale
            m = cute.make_rmem_tensor((R,), Float32)
            l = cute.make_rmem_tensor((R,), Float32)     # this lane's share of the denominator
            acc = cute.make_rmem_tensor((VC, R), Float32)
            for r in cutlass.range_constexpr(R):
                m[r] = NEG
                l[r] = 0.0
                for e in cutlass.range_constexpr(VC):
                    acc[e, r] = 0.0
            rc = cute.make_rmem_tensor((VC, UNROLL), ckv.element_type)    # rc[None, u] is contiguous
            rp = cute.make_rmem_tensor((VP, UNROLL), kpe.element_type)
            for j in range(0, kend, UNROLL):
                for uu in cutlass.range_constexpr(UNROLL):
                    krow = idx[p0 + cutlass.min(j + uu, kend - 1)]
                    cute.autovec_copy(cute.zipped_divide(ckv[krow, None], (VC,))[None, lane], rc[None, uu])
                    cute.autovec_copy(cute.zipped_divide(kpe[krow, None], (VP,))[None, lane], rp[None, uu])
                for uu in cutlass.range_constexpr(UNROLL):
                    for r in cutlass.range_constexpr(R):
                        sc = Float32(0.0)
                        for e in cutlass.range_constexpr(VC):
                            sc = sc + qc[e, r] * rc[e, uu].to(Float32)
                        for e in cutlass.range_constexpr(VP):
                            sc = sc + qr[e, r] * rp[e, uu].to(Float32)
                        sc = cute.arch.warp_reduction_sum(sc)
                        if j + uu < kend:                       # causal (also ends the last partial step)
                            m_new = cutlass.max(m[r], sc)
                            corr = cute.math.exp2(m[r] - m_new, fastmath=True)
                            p = cute.math.exp2(sc - m_new, fastmath=True)
                            l[r] = l[r] * corr
                            if (j + uu) % 32 == lane:
                                l[r] = l[r] + p
                            for e in cutlass.range_constexpr(VC):
                                acc[e, r] = acc[e, r] * corr + p * rc[e, uu].to(Float32)
                            m[r] = m_new
            ro = cute.make_rmem_tensor((VC,), out.element_type)
            for r in cutlass.range_constexpr(R):
                lsum = cute.arch.warp_reduction_sum(l[r])           # every lane: the whole denominator
                orow = (qo[bsel] + isel) * H + hg * R + r
                inv = 1.0 / lsum
                for e in cutlass.range_constexpr(VC):
                    ro[e] = (acc[e, r] * inv).to(out.element_type)
                cute.autovec_copy(ro, cute.zipped_divide(out[orow, None], (VC,))[None, lane])
                if lane == 0:
                    lse[orow] = m[r] + cute.math.log2(lsum)


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _prepare(q_nope, q_pe, ckv_cache, kpe_cache, qo_indptr, kv_indptr, kv_indices, sm_scale, arch=None):
    heads = q_nope.shape[1]
    assert q_nope.shape[2] == DC and q_pe.shape[2] == DP and heads % R == 0
    assert ckv_cache.shape[1] == 1 and ckv_cache.shape[2] == DC and kpe_cache.shape[2] == DP
    key = (heads, float(sm_scale))
    if key not in _COMPILED:
        opts = f"--gpu-arch {arch or _arch()} --enable-tvm-ffi"
        bf = cutlass.BFloat16
        qrows, pool, nb1, nt = (cute.sym_int() for _ in range(4))
        stream = make_fake_stream(use_tvm_ffi_env_stream=True)
        mk = lambda r, c: make_fake_compact_tensor(bf, (r, c), stride_order=(1, 0), assumed_align=16)  # noqa: E731
        fptr = make_fake_compact_tensor(Int32, (nb1,))
        fidx = make_fake_compact_tensor(Int32, (nt,))
        kernel = MlaPagedPrefill(heads, float(sm_scale) * math.log2(math.e))
        _COMPILED[key] = (cute.compile(kernel, mk(qrows, DC), mk(qrows, DP), mk(pool, DC), mk(pool, DP), fptr,
                                       fptr, fidx, mk(qrows, DC), make_fake_compact_tensor(Float32, (qrows,)),
                                       stream, options=opts),)
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
