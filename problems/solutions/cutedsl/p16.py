"""p16 MLA ragged causal prefill, non-absorbed (16 heads, qk 192 / vo 128, bf16) in CuTe DSL: a warp per row tile.

Work item = (sequence, tile of QT queries) x kv head, found by a scan of qo_indptr inside the kernel (no
host sync).  A warp owns the R = QT x G (query, head) rows of its tile that read one kv head, so each K
and V row it loads serves all R rows (here 8 queries of one head: every head has its own K and V); a
lane holds DQK/32 (6) dims of q and K and DV/32 (4) dims of V and of the output.  Per key: R dot
products summed over the warp with butterfly shuffles, the causal mask (key <= query + kv_len - q_len,
decided per row and the same on every lane) and an online softmax in base 2 (q pre-scaled by
sm_scale*log2 e).  The warp walks its keys once up to the tile's last visible key and writes out = acc /
l (bf16) and lse = m + log2 l directly: no partials, no merge.
"""
import math

import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

QT = 8                 # queries per warp tile: 8 consecutive queries of one head share each K/V row load
WARPS = 4
UNROLL = 4
NEG = -1.0e30


class RaggedPrefill:
    def __init__(self, kv_heads: int, group: int, dqk: int, dv: int, qscale: float):
        self.KVH, self.G, self.DQK, self.DV = kv_heads, group, dqk, dv
        self.VK, self.VV = dqk // 32, dv // 32
        self.R = QT * group
        self.qscale = qscale

    @cute.jit
    def __call__(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, qo: cute.Tensor, kv: cute.Tensor,
                 out: cute.Tensor, lse: cute.Tensor, stream):
        ntiles = q.shape[0] // (self.KVH * self.G * QT) + qo.shape[0] - 1   # bounds sum(ceil(q_len/QT))
        self.kernel(q, k, v, qo, kv, out, lse).launch(
            grid=[(ntiles + WARPS - 1) // WARPS, self.KVH, 1], block=[32 * WARPS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, qo: cute.Tensor, kv: cute.Tensor,
               out: cute.Tensor, lse: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bx, g, _ = cute.arch.block_idx()
        lane = tidx % 32
        tile = bx * WARPS + tidx // 32
        G, R, KVH, VK, VV = self.G, self.R, self.KVH, self.VK, self.VV
        H = KVH * G
        batch = qo.shape[0] - 1
        cum = Int32(0)
        bsel = Int32(-1)
        tsel = Int32(0)
        for bb in range(batch):
            n = (qo[bb + 1] - qo[bb] + QT - 1) // QT
            if bsel < 0:
                if tile < cum + n:
                    bsel = bb
                    tsel = tile - cum
            cum = cum + n
        if bsel >= 0:
            qlen = qo[bsel + 1] - qo[bsel]
            k0 = kv[bsel]
            off = kv[bsel + 1] - k0 - qlen          # query i sees keys j <= i + off
            i0 = tsel * QT                           # first query of the tile, in the sequence
            nq = cutlass.min(QT, qlen - i0)
            kend = i0 + nq + off                     # keys [0, kend) are seen by some row of the tile
            qf = cute.make_rmem_tensor((VK, R), Float32)
            rq = cute.make_rmem_tensor((VK,), q.element_type)
            for r in cutlass.range_constexpr(R):
                qrow = (qo[bsel] + i0 + cutlass.min(r // G, nq - 1)) * H + g * G + r % G
                cute.autovec_copy(cute.zipped_divide(q[qrow, None], (VK,))[None, lane], rq)
                for e in cutlass.range_constexpr(VK):
                    qf[e, r] = rq[e].to(Float32) * self.qscale
            m = cute.make_rmem_tensor((R,), Float32)
            l = cute.make_rmem_tensor((R,), Float32)
            acc = cute.make_rmem_tensor((VV, R), Float32)
            for r in cutlass.range_constexpr(R):
                m[r] = NEG
                l[r] = 0.0
                for e in cutlass.range_constexpr(VV):
                    acc[e, r] = 0.0
            rk = cute.make_rmem_tensor((VK, UNROLL), k.element_type)    # rk[None, u] is contiguous
            rv = cute.make_rmem_tensor((VV, UNROLL), v.element_type)
            for j in range(0, kend, UNROLL):
                for uu in cutlass.range_constexpr(UNROLL):
                    krow = (k0 + cutlass.min(j + uu, kend - 1)) * KVH + g
                    cute.autovec_copy(cute.zipped_divide(k[krow, None], (VK,))[None, lane], rk[None, uu])
                    cute.autovec_copy(cute.zipped_divide(v[krow, None], (VV,))[None, lane], rv[None, uu])
                for uu in cutlass.range_constexpr(UNROLL):
                    for r in cutlass.range_constexpr(R):
                        sc = Float32(0.0)
                        for e in cutlass.range_constexpr(VK):
                            sc = sc + qf[e, r] * rk[e, uu].to(Float32)
                        sc = cute.arch.warp_reduction_sum(sc)
                        if j + uu <= i0 + r // G + off:          # causal (also ends the last partial step)
                            m_new = cutlass.max(m[r], sc)
                            corr = cute.math.exp2(m[r] - m_new, fastmath=True)
                            p = cute.math.exp2(sc - m_new, fastmath=True)
                            l[r] = l[r] * corr + p
                            for e in cutlass.range_constexpr(VV):
                                acc[e, r] = acc[e, r] * corr + p * rv[e, uu].to(Float32)
                            m[r] = m_new
            ro = cute.make_rmem_tensor((VV,), out.element_type)
            for r in cutlass.range_constexpr(R):
                if r // G < nq:
                    orow = (qo[bsel] + i0 + r // G) * H + g * G + r % G
                    inv = 1.0 / l[r]
                    for e in cutlass.range_constexpr(VV):
                        ro[e] = (acc[e, r] * inv).to(out.element_type)
                    cute.autovec_copy(ro, cute.zipped_divide(out[orow, None], (VV,))[None, lane])
                    if lane == 0:
                        lse[orow] = m[r] + cute.math.log2(l[r])


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _prepare(q, k, v, qo_indptr, kv_indptr, sm_scale, arch=None):
    heads, dqk = q.shape[1], q.shape[2]
    kv_heads, dv = k.shape[1], v.shape[2]
    assert heads % kv_heads == 0 and dqk % 32 == 0 and dv % 32 == 0
    key = (heads, kv_heads, dqk, dv, float(sm_scale))
    if key not in _COMPILED:
        opts = f"--gpu-arch {arch or _arch()} --enable-tvm-ffi"
        bf = cutlass.BFloat16
        qr, kr, nb1 = (cute.sym_int() for _ in range(3))
        stream = make_fake_stream(use_tvm_ffi_env_stream=True)
        mk = lambda r, c: make_fake_compact_tensor(bf, (r, c), stride_order=(1, 0), assumed_align=16)  # noqa: E731
        fptr = make_fake_compact_tensor(Int32, (nb1,))
        kernel = RaggedPrefill(kv_heads, heads // kv_heads, dqk, dv, float(sm_scale) * math.log2(math.e))
        _COMPILED[key] = (cute.compile(kernel, mk(qr, dqk), mk(kr, dqk), mk(kr, dv), fptr, fptr, mk(qr, dv),
                                       make_fake_compact_tensor(Float32, (qr,)), stream, options=opts),)
    return list(_COMPILED[key])


def solve(q, k, v, qo_indptr, kv_indptr, sm_scale):
    (prefill,) = _prepare(q, k, v, qo_indptr, kv_indptr, sm_scale)
    total_q, heads, dqk = q.shape
    dv = v.shape[2]
    out = torch.empty(total_q * heads, dv, dtype=q.dtype, device=q.device)
    lse = torch.empty(total_q * heads, dtype=torch.float32, device=q.device)
    prefill(q.contiguous().view(-1, dqk), k.contiguous().view(-1, dqk), v.contiguous().view(-1, dv),
            qo_indptr.contiguous(), kv_indptr.contiguous(), out, lse)
    return out.view(total_q, heads, dv), lse.view(total_q, heads)
