"""p05 causal GQA paged prefill (page size 1, 5 q heads : 1 kv head, head dim 128, bf16) in CuTe DSL: a warp per row tile.

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

import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

D = 128
VEC = D // 32          # dims per lane
QT = 2                 # queries per warp tile: 2 queries x 5 heads share each K/V row load
WARPS = 4
UNROLL = 4
NEG = -1.0e30


class PagedPrefill:
    def __init__(self, kv_heads: int, group: int, qscale: float):
        self.KVH, self.G = kv_heads, group
        self.R = QT * group
        self.qscale = qscale

    @cute.jit
    def __call__(self, q: cute.Tensor, kc: cute.Tensor, vc: cute.Tensor, qo: cute.Tensor, kv: cute.Tensor,
                 idx: cute.Tensor, out: cute.Tensor, lse: cute.Tensor, stream):
        ntiles = q.shape[0] // (self.KVH * self.G * QT) + qo.shape[0] - 1   # bounds sum(ceil(q_len/QT))
        self.kernel(q, kc, vc, qo, kv, idx, out, lse).launch(
            grid=[(ntiles + WARPS - 1) // WARPS, self.KVH, 1], block=[32 * WARPS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, q: cute.Tensor, kc: cute.Tensor, vc: cute.Tensor, qo: cute.Tensor, kv: cute.Tensor,
               idx: cute.Tensor, out: cute.Tensor, lse: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bx, g, _ = cute.arch.block_idx()
        lane = tidx % 32
        rtile = bx * WARPS + tidx // 32              # tiles counted from the last one (see the scan)
        G, R, KVH = self.G, self.R, self.KVH
        H = KVH * G
        batch = qo.shape[0] - 1
        cum = Int32(0)
        bsel = Int32(-1)
        tsel = Int32(0)
        for bi in range(batch):
            bb = batch - 1 - bi
            n = (qo[bb + 1] - qo[bb] + QT - 1) // QT
            if bsel < 0:
                if rtile < cum + n:
                    bsel = bb
                    tsel = n - 1 - (rtile - cum)
            cum = cum + n
        if bsel >= 0:
            qlen = qo[bsel + 1] - qo[bsel]
            p0 = kv[bsel]
            off = kv[bsel + 1] - p0 - qlen           # query i sees keys j <= i + off
            i0 = tsel * QT                           # first query of the tile, in the sequence
            nq = cutlass.min(QT, qlen - i0)
            kend = i0 + nq + off                     # keys [0, kend) are seen by some row of the tile
            qf = cute.make_rmem_tensor((VEC, R), Float32)
            rq = cute.make_rmem_tensor((VEC,), q.element_type)
            for r in cutlass.range_constexpr(R):
                qrow = (qo[bsel] + i0 + cutlass.min(r // G, nq - 1)) * H + g * G + r % G
                cute.autovec_copy(cute.zipped_divide(q[qrow, None], (VEC,))[None, lane], rq)
                for e in cutlass.range_constexpr(VEC):
                    qf[e, r] = rq[e].to(Float32) * self.qscale
            m = cute.make_rmem_tensor((R,), Float32)
            l = cute.make_rmem_tensor((R,), Float32)     # this lane's share of the denominator
            acc = cute.make_rmem_tensor((VEC, R), Float32)
            for r in cutlass.range_constexpr(R):
                m[r] = NEG
                l[r] = 0.0
                for e in cutlass.range_constexpr(VEC):
                    acc[e, r] = 0.0
            rk = cute.make_rmem_tensor((VEC, UNROLL), kc.element_type)    # rk[None, u] is contiguous
            rv = cute.make_rmem_tensor((VEC, UNROLL), vc.element_type)
            for j in range(0, kend, UNROLL):
                for uu in cutlass.range_constexpr(UNROLL):
                    krow = idx[p0 + cutlass.min(j + uu, kend - 1)] * KVH + g
                    cute.autovec_copy(cute.zipped_divide(kc[krow, None], (VEC,))[None, lane], rk[None, uu])
                    cute.autovec_copy(cute.zipped_divide(vc[krow, None], (VEC,))[None, lane], rv[None, uu])
                for uu in cutlass.range_constexpr(UNROLL):
                    for r in cutlass.range_constexpr(R):
                        sc = Float32(0.0)
                        for e in cutlass.range_constexpr(VEC):
                            sc = sc + qf[e, r] * rk[e, uu].to(Float32)
                        sc = cute.arch.warp_reduction_sum(sc)
                        if j + uu <= i0 + r // G + off:          # causal (also ends the last partial step)
                            m_new = cutlass.max(m[r], sc)
                            corr = cute.math.exp2(m[r] - m_new, fastmath=True)
                            p = cute.math.exp2(sc - m_new, fastmath=True)
                            l[r] = l[r] * corr
                            if (j + uu) % 32 == lane:
                                l[r] = l[r] + p
                            for e in cutlass.range_constexpr(VEC):
                                acc[e, r] = acc[e, r] * corr + p * rv[e, uu].to(Float32)
                            m[r] = m_new
            ro = cute.make_rmem_tensor((VEC,), out.element_type)
            for r in cutlass.range_constexpr(R):
                lsum = cute.arch.warp_reduction_sum(l[r])           # every lane: the whole denominator
                if r // G < nq:
                    orow = (qo[bsel] + i0 + r // G) * H + g * G + r % G
                    inv = 1.0 / lsum
                    for e in cutlass.range_constexpr(VEC):
                        ro[e] = (acc[e, r] * inv).to(out.element_type)
                    cute.autovec_copy(ro, cute.zipped_divide(out[orow, None], (VEC,))[None, lane])
                    if lane == 0:
                        lse[orow] = m[r] + cute.math.log2(lsum)


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _prepare(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, sm_scale, arch=None):
    heads = q.shape[1]
    page_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    assert q.shape[2] == D and page_size == 1 and heads % kv_heads == 0
    key = (heads, kv_heads, float(sm_scale))
    if key not in _COMPILED:
        opts = f"--gpu-arch {arch or _arch()} --enable-tvm-ffi"
        bf = cutlass.BFloat16
        qr, kr, nb1, nt = (cute.sym_int() for _ in range(4))
        stream = make_fake_stream(use_tvm_ffi_env_stream=True)
        mk = lambda r: make_fake_compact_tensor(bf, (r, D), stride_order=(1, 0), assumed_align=16)  # noqa: E731
        fptr = make_fake_compact_tensor(Int32, (nb1,))
        fidx = make_fake_compact_tensor(Int32, (nt,))
        kernel = PagedPrefill(kv_heads, heads // kv_heads, float(sm_scale) * math.log2(math.e))
        _COMPILED[key] = (cute.compile(kernel, mk(qr), mk(kr), mk(kr), fptr, fptr, fidx, mk(qr),
                                       make_fake_compact_tensor(Float32, (qr,)), stream, options=opts),)
    return list(_COMPILED[key])


def solve(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, sm_scale):
    (prefill,) = _prepare(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, sm_scale)
    total_q, heads, _ = q.shape
    out = torch.empty(total_q * heads, D, dtype=q.dtype, device=q.device)
    lse = torch.empty(total_q * heads, dtype=torch.float32, device=q.device)
    prefill(q.contiguous().view(-1, D), k_cache.contiguous().view(-1, D), v_cache.contiguous().view(-1, D),
            qo_indptr.contiguous(), kv_indptr.contiguous(), kv_indices.contiguous(), out, lse)
    return out.view(total_q, heads, D), lse.view(total_q, heads)
