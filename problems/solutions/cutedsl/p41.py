"""p41 Gemma 3n audio Q/K/V projections + per-head q/k RMSNorm (fp32) in CuTe DSL: a SIMT GEMM per projection.

fp32 in and out against a fp32 reference: tensor cores (TF32) would round the operands to 10 bits, so each
projection is a CUDA-core FFMA GEMM (p39's scheme): 256 threads, smem tiles of 32 k x BM rows and
32 k x one head (128 columns), a 4 x 4 register tile per thread, and per k-tile a fresh chain of 32
FMAs added to the accumulator (short chains: one FMA chain over K = 1024 would add K rounding steps).
A CTA's column tile is exactly one head, so the RMSNorm is the epilogue: the 32 lanes of a warp hold
4 whole rows (4 columns each), the row's sum of squares is a butterfly over those lanes, and
out = acc * rsqrt(sum / 128 + eps) * weight, in the reference's order.  v is the same GEMM without
the norm.  Three launches (q, k, v), each writing its [B, S, 8, 128] output directly.
"""
import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

THREADS = 256
BK = 32


class HeadGemm:
    """out[m, n] = sum_k x[m, k] * w[n, k]; with `norm`, each head (BN = head dim columns) RMS-normalised."""

    def __init__(self, k: int, d: int, norm: bool, eps: float):
        self.K, self.BN, self.norm, self.eps = k, d, norm, eps
        self.TC = d // 4                              # threads per row group (4 columns each)
        self.BM = (THREADS // self.TC) * 4

    @cute.jit
    def __call__(self, x: cute.Tensor, w: cute.Tensor, nw: cute.Tensor, out: cute.Tensor, stream):
        grid = [(x.shape[0] + self.BM - 1) // self.BM, w.shape[0] // self.BN, 1]
        self.kernel(x, w, nw, out).launch(grid=grid, block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, x: cute.Tensor, w: cute.Tensor, nw: cute.Tensor, out: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bm, bn, _ = cute.arch.block_idx()
        BM, BN = self.BM, self.BN
        m = x.shape[0]
        alloc = cutlass.memory.SmemAllocator()
        a_s = alloc.allocate_tensor(Float32, cute.make_layout((BK, BM + 4), stride=(BM + 4, 1)), byte_alignment=16)
        b_s = alloc.allocate_tensor(Float32, cute.make_layout((BK, BN + 4), stride=(BN + 4, 1)), byte_alignment=16)
        row0 = bm * BM
        col0 = bn * BN
        tr = tidx // self.TC
        tc = tidx % self.TC
        acc = cute.make_rmem_tensor((16,), Float32)
        acc.fill(0.0)
        tile = cute.make_rmem_tensor((16,), Float32)
        ra = cute.make_rmem_tensor((4,), Float32)
        rb = cute.make_rmem_tensor((4,), Float32)
        v = cute.make_rmem_tensor((4,), Float32)
        for kt in range(self.K // BK):
            k0 = kt * BK
            for i in cutlass.range_constexpr((BM * BK // 4 + THREADS - 1) // THREADS):
                ca = i * THREADS + tidx
                if ca < BM * BK // 4:
                    ar = ca // (BK // 4)
                    kqa = (ca % (BK // 4)) * 4
                    ga = cutlass.min(row0 + ar, m - 1)
                    cute.autovec_copy(cute.zipped_divide(x[ga, None], (4,))[None, (k0 + kqa) // 4], v)
                    for e in cutlass.range_constexpr(4):
                        a_s[kqa + e, ar] = v[e]
            for i in cutlass.range_constexpr((BN * BK // 4 + THREADS - 1) // THREADS):
                cb = i * THREADS + tidx
                if cb < BN * BK // 4:
                    nb = cb // (BK // 4)
                    kqb = (cb % (BK // 4)) * 4
                    cute.autovec_copy(cute.zipped_divide(w[col0 + nb, None], (4,))[None, (k0 + kqb) // 4], rb)
                    for e in cutlass.range_constexpr(4):
                        b_s[kqb + e, nb] = rb[e]
            cute.arch.sync_threads()
            tile.fill(0.0)                      # a fresh chain per k-tile: 32 + K/32 terms, not K
            for kk in cutlass.range_constexpr(BK):
                cute.autovec_copy(cute.zipped_divide(a_s[kk, None], (4,))[None, tr], ra)
                cute.autovec_copy(cute.zipped_divide(b_s[kk, None], (4,))[None, tc], rb)
                for i in cutlass.range_constexpr(4):
                    for j in cutlass.range_constexpr(4):
                        tile[i * 4 + j] = tile[i * 4 + j] + ra[i] * rb[j]
            for i in cutlass.range_constexpr(16):
                acc[i] = acc[i] + tile[i]
            cute.arch.sync_threads()
        if cutlass.const_expr(self.norm):
            for j in cutlass.range_constexpr(4):
                rb[j] = Float32(nw[tc * 4 + j])
            for i in cutlass.range_constexpr(4):
                q = Float32(0.0)
                for j in cutlass.range_constexpr(4):
                    q = q + acc[i * 4 + j] * acc[i * 4 + j]
                for o in cutlass.range_constexpr(self.TC.bit_length() - 1):   # the row's TC lanes
                    q = q + cute.arch.shuffle_sync_bfly(q, offset=1 << o)
                rstd = cute.math.rsqrt(q / Float32(BN) + Float32(self.eps))
                for j in cutlass.range_constexpr(4):
                    acc[i * 4 + j] = acc[i * 4 + j] * rstd * rb[j]
        for i in cutlass.range_constexpr(4):
            er = row0 + tr * 4 + i
            if er < m:
                for j in cutlass.range_constexpr(4):
                    v[j] = acc[i * 4 + j]
                cute.autovec_copy(v, cute.zipped_divide(out[er, None], (4,))[None, (col0 + tc * 4) // 4])


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _prepare(x, w_q, w_k, w_v, q_norm_w, k_norm_w, eps, arch=None):
    k, n, d = x.shape[-1], w_q.shape[0], q_norm_w.shape[0]
    key = (k, n, d, float(eps))
    assert k % BK == 0 and n % d == 0 and d % 4 == 0 and THREADS % (d // 4) == 0 and (d // 4) <= 32, key
    assert (d // 4) & (d // 4 - 1) == 0, "the norm's butterfly needs a power-of-two lane count"
    if key not in _COMPILED:
        opts = f"--gpu-arch {arch or _arch()} --enable-tvm-ffi"
        stream = make_fake_stream(use_tvm_ffi_env_stream=True)
        m = cute.sym_int()
        xs = make_fake_compact_tensor(Float32, (m, k), stride_order=(1, 0), assumed_align=16)
        ws = make_fake_compact_tensor(Float32, (n, k), stride_order=(1, 0), assumed_align=16)
        nw = make_fake_compact_tensor(Float32, (d,), assumed_align=16)
        os = make_fake_compact_tensor(Float32, (m, n), stride_order=(1, 0), assumed_align=16)
        _COMPILED[key] = [cute.compile(HeadGemm(k, d, norm, float(eps)), xs, ws, nw, os, stream, options=opts)
                          for norm in (True, False)]
    return list(_COMPILED[key])


def solve(x, w_q, w_k, w_v, q_norm_w, k_norm_w, eps):
    normed, plain = _prepare(x, w_q, w_k, w_v, q_norm_w, k_norm_w, eps)
    b, s, k = x.shape
    d = q_norm_w.shape[0]
    x2 = x.reshape(b * s, k)
    outs = [torch.empty(b, s, w.shape[0] // d, d, dtype=x.dtype, device=x.device) for w in (w_q, w_k, w_v)]
    normed(x2, w_q, q_norm_w, outs[0].view(b * s, -1))
    normed(x2, w_k, k_norm_w, outs[1].view(b * s, -1))
    plain(x2, w_v, q_norm_w, outs[2].view(b * s, -1))
    return tuple(outs)
