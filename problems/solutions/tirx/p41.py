"""p41 Gemma 3n audio Q/K/V projections + per-head q/k RMSNorm (fp32) in TIRx: a SIMT GEMM per projection.

fp32 in and out against a fp32 reference: tensor cores (TF32) would round the operands to 10 bits, so each
projection is a CUDA-core FFMA GEMM (p39's scheme): 256 threads, smem tiles of 32 k x BM rows and
32 k x one head (128 columns), a 4 x 4 register tile per thread, and per k-tile a fresh chain of 32
FMAs added to the accumulator (short chains: one FMA chain over K = 1024 would add K rounding steps).
A CTA's column tile is exactly one head, so the RMSNorm is the epilogue: the 32 lanes of a warp hold
4 whole rows (4 columns each), the row's sum of squares is a shuffle sum over those lanes, and
out = acc * rsqrt(sum / 128 + eps) * weight, in the reference's order.  v is the same GEMM without
the norm.  Three launches (q, k, v), each writing its [B, S, 8, 128] output directly.
"""
import torch  # before tvm, so TVM's CUDA runtime finds the already-loaded CUDA libraries

import tvm
from tvm.script import tirx as T

THREADS = 256
BK = 32


def _gemm(K: int, N: int, D: int, NORM: bool, EPS: float):
    """out[m, n] = sum_k x[m, k] * w[n, k]; with NORM, each head (D columns) RMS-normalised."""
    TC = D // 4                                # threads per row group (4 columns each)
    BM = (THREADS // TC) * 4
    AV, BV = BM * BK // 4, D * BK // 4         # float4 chunks of the x and W tiles

    @T.prim_func
    def head_gemm(x_h: T.handle, w_h: T.handle, nw_h: T.handle, out_h: T.handle):
        m = T.int32()
        X = T.match_buffer(x_h, (m, K), "float32", align=16)
        W = T.match_buffer(w_h, (N, K), "float32", align=16)
        NW = T.match_buffer(nw_h, (D,), "float32", align=16)
        OUT = T.match_buffer(out_h, (m, N), "float32", align=16)
        T.device_entry()
        bm, bn = T.cta_id([T.ceildiv(m, BM), N // D])
        tx = T.thread_id([THREADS])
        a_s = T.alloc_shared((BK, BM + 4), "float32")
        b_s = T.alloc_shared((BK, D + 4), "float32")
        acc = T.alloc_local((16,), "float32")
        tile = T.alloc_local((16,), "float32")
        ra = T.alloc_local((4,), "float32")
        rb = T.alloc_local((4,), "float32")
        v = T.alloc_local((4,), "float32")
        part = T.alloc_local((1,), "float32")
        tr: T.let = tx // TC
        tc: T.let = tx % TC
        for i in T.unroll(16):
            acc[i] = T.float32(0)
        for kt in T.serial(K // BK):
            k0 = T.meta_var(kt * BK)
            for i in T.unroll((AV + THREADS - 1) // THREADS):
                ca = T.meta_var(i * THREADS + tx)
                if ca < AV:
                    ar = T.meta_var(ca // (BK // 4))
                    kq = T.meta_var((ca % (BK // 4)) * 4)
                    T.tile.copy(v[:], X[T.min(bm * BM + ar, m - 1), k0 + kq:k0 + kq + 4])
                    for e in T.unroll(4):
                        a_s[kq + e, ar] = v[e]
            for i in T.unroll((BV + THREADS - 1) // THREADS):
                cb = T.meta_var(i * THREADS + tx)
                if cb < BV:
                    nb = T.meta_var(cb // (BK // 4))
                    kq = T.meta_var((cb % (BK // 4)) * 4)
                    T.tile.copy(v[:], W[bn * D + nb, k0 + kq:k0 + kq + 4])
                    for e in T.unroll(4):
                        b_s[kq + e, nb] = v[e]
            T.cuda.cta_sync()
            for i in T.unroll(16):             # a fresh chain per k-tile: 32 + K/32 terms, not K
                tile[i] = T.float32(0)
            for kk in T.unroll(BK):
                T.tile.copy(ra[:], a_s[kk, tr * 4:tr * 4 + 4])
                T.tile.copy(rb[:], b_s[kk, tc * 4:tc * 4 + 4])
                for i in T.unroll(4):
                    for j in T.unroll(4):
                        tile[i * 4 + j] = tile[i * 4 + j] + ra[i] * rb[j]
            for i in T.unroll(16):
                acc[i] = acc[i] + tile[i]
            T.cuda.cta_sync()
        if NORM:
            T.tile.copy(rb[:], NW[tc * 4:tc * 4 + 4])
            for i in T.unroll(4):
                part[0] = T.float32(0)
                for j in T.unroll(4):
                    part[0] = part[0] + acc[i * 4 + j] * acc[i * 4 + j]
                q: T.float32 = T.cuda.warp_sum(part[0], TC)     # the row's TC lanes
                part[0] = T.rsqrt(q / T.float32(D) + T.float32(EPS))
                for j in T.unroll(4):
                    acc[i * 4 + j] = acc[i * 4 + j] * part[0] * rb[j]
        for i in T.unroll(4):
            er = T.meta_var(bm * BM + tr * 4 + i)
            if er < m:
                for j in T.unroll(4):
                    v[j] = acc[i * 4 + j]
                T.tile.copy(OUT[er, bn * D + tc * 4:bn * D + tc * 4 + 4], v[:])

    return head_gemm


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _build(func, arch):
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    with target:
        return tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")


def _prepare(x, w_q, w_k, w_v, q_norm_w, k_norm_w, eps, arch=None):
    k, n, d = x.shape[-1], w_q.shape[0], q_norm_w.shape[0]
    key = (k, n, d, float(eps))
    assert k % BK == 0 and n % d == 0 and d % 4 == 0 and THREADS % (d // 4) == 0 and (d // 4) <= 32, key
    assert (d // 4) & (d // 4 - 1) == 0, "the norm's shuffle sum needs a power-of-two lane count"
    if key not in _COMPILED:
        arch = arch or _arch()
        _COMPILED[key] = [_build(_gemm(k, n, d, norm, float(eps)), arch) for norm in (True, False)]
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
