"""p72 gated DeltaNet decode step (Qwen3-Next) in CuTe DSL: one fused, coalesced, memory-bound state update.

The state is stored [V, K] (key dim last): row j (value j) is the key vector S[:, j], and the update is
independent per row.  8 lanes share a row, lane l holding the float4s l, l + 8, l + 16, l + 24 of it
(every warp-wide 16-byte load or store covers whole 128-byte lines); a warp holds 4 row groups of 4 rows
(64 registers of state), its loads all issued before any arithmetic.  Per row: S' = alpha S,
k.S' and q.S_new as 4 per-component FMA partial sums per lane, (p0 + p1) + (p2 + p3), then a butterfly over
the row's 8 lanes (xor 1, 2, 4); delta = (v - k.S') beta; S_new = S' + k delta; o = (q.S_new) scale.
A CTA of 4 warps handles 64 rows of one (value head, sequence): 2048 CTAs of 128 threads.  One read and
one write of the state, the SOL traffic.  q and k are used as given; the per-head gate scalars
alpha = exp(-exp(A_log) softplus(a + dt_bias)) and beta = sigmoid(b) are evaluated in fp64, rounded once.
"""
import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Float64
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

WARPS = 4
G = 4                   # row groups per warp, loaded together


class GdnDecode:
    def __init__(self, k_heads: int, v_heads: int, dk: int, dv: int, scale: float):
        self.HK, self.HV, self.DK, self.DV, self.scale = k_heads, v_heads, dk, dv, scale
        self.rep = v_heads // k_heads
        self.L = min(8, dk // 4)           # lanes per row
        self.M = dk // (4 * self.L)        # float4s per lane
        self.RG = 32 // self.L             # rows per row group (a warp-wide instruction)
        self.ROWS = WARPS * G * self.RG    # rows per CTA
        assert dk % (4 * self.L) == 0 and 32 % self.L == 0

    @cute.jit
    def __call__(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, a: cute.Tensor, b: cute.Tensor,
                 alog: cute.Tensor, dtb: cute.Tensor, s_in: cute.Tensor, o: cute.Tensor, s_out: cute.Tensor, stream):
        batch = a.shape[0] // self.HV
        self.kernel(q, k, v, a, b, alog, dtb, s_in, o, s_out).launch(
            grid=[self.HV, batch, (self.DV + self.ROWS - 1) // self.ROWS], block=[32 * WARPS, 1, 1], stream=stream)

    @cute.jit
    def dot(self, x, S):
        """sum_i x_i S_i over a row: per-component partial sums over the lane's float4s, then the row's lanes."""
        part = [x[0][e] * S[0][e] for e in range(4)]
        for m in cutlass.range_constexpr(1, self.M):
            for e in cutlass.range_constexpr(4):
                part[e] = part[e] + x[m][e] * S[m][e]
        acc = (part[0] + part[1]) + (part[2] + part[3])
        sh = 1
        while sh < self.L:
            acc = acc + cute.arch.shuffle_sync_bfly(acc, offset=sh)
            sh *= 2
        return acc

    @cute.kernel
    def kernel(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, a: cute.Tensor, b: cute.Tensor,
               alog: cute.Tensor, dtb: cute.Tensor, s_in: cute.Tensor, o: cute.Tensor, s_out: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        h, bi, rb = cute.arch.block_idx()
        L, M, RG, DV = self.L, self.M, self.RG, self.DV
        lane = tidx % 32
        li = lane % L
        first = rb * self.ROWS + (tidx // 32) * (G * RG) + lane // L    # this lane's row in group 0
        bh = bi * self.HV + h
        krow = bi * self.HK + h // self.rep
        S = [[cute.make_rmem_tensor((4,), Float32) for _ in range(M)] for _ in range(G)]
        for gi in cutlass.range_constexpr(G):                  # every state load first
            row = cutlass.min(first + gi * RG, DV - 1)
            src = cute.zipped_divide(s_in[bh * DV + row, None], (4,))
            for m in cutlass.range_constexpr(M):
                cute.autovec_copy(src[None, li + L * m], S[gi][m])
        kv = [cute.make_rmem_tensor((4,), k.element_type) for _ in range(M)]
        qv = [cute.make_rmem_tensor((4,), q.element_type) for _ in range(M)]
        for m in cutlass.range_constexpr(M):
            cute.autovec_copy(cute.zipped_divide(k[krow, None], (4,))[None, li + L * m], kv[m])
            cute.autovec_copy(cute.zipped_divide(q[krow, None], (4,))[None, li + L * m], qv[m])
        kf = [kv[m].load().to(Float32) for m in range(M)]
        qf = [qv[m].load().to(Float32) for m in range(M)]
        # per-head gate scalars in fp64, rounded once
        x = Float64(a[bh].to(Float32)) + Float64(dtb[h])
        sp = cute.math.log1p(cute.math.exp(x))
        if x > 20.0:
            sp = x
        decay = Float32(cute.math.exp(-cute.math.exp(Float64(alog[h])) * sp))
        beta = Float32(1.0 / (1.0 + cute.math.exp(-Float64(b[bh].to(Float32)))))
        for gi in cutlass.range_constexpr(G):
            row = first + gi * RG
            rowc = cutlass.min(row, DV - 1)
            for m in cutlass.range_constexpr(M):
                for e in cutlass.range_constexpr(4):
                    S[gi][m][e] = S[gi][m][e] * decay
            kS = self.dot(kf, S[gi])
            delta = (v[bh, rowc].to(Float32) - kS) * beta
            for m in cutlass.range_constexpr(M):
                for e in cutlass.range_constexpr(4):
                    S[gi][m][e] = S[gi][m][e] + kf[m][e] * delta
            acc = self.dot(qf, S[gi])
            if row < DV:
                dst = cute.zipped_divide(s_out[bh * DV + row, None], (4,))
                for m in cutlass.range_constexpr(M):
                    cute.autovec_copy(S[gi][m], dst[None, li + L * m])
                if li == 0:
                    o[bh, row] = (acc * self.scale).to(o.element_type)


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _prepare(q, k, v, state, A_log, a, dt_bias, b, scale, arch=None):
    key = (q.shape[2], v.shape[2], q.shape[3], v.shape[3], float(scale))
    assert q.shape[3] == v.shape[3] == state.shape[2] == state.shape[3]
    if key not in _COMPILED:
        hk, hv, dk, dv, _ = key
        bf = cutlass.BFloat16
        r1, r2, r3 = (cute.sym_int() for _ in range(3))
        mk = lambda dt, r, c: make_fake_compact_tensor(dt, (r, c), stride_order=(1, 0), assumed_align=16)  # noqa: E731
        args = [mk(bf, r1, dk), mk(bf, r1, dk), mk(bf, r2, dv), make_fake_compact_tensor(bf, (r2,)),
                make_fake_compact_tensor(bf, (r2,)), make_fake_compact_tensor(Float32, (hv,)),
                make_fake_compact_tensor(Float32, (hv,)), mk(Float32, r3, dk), mk(bf, r2, dv), mk(Float32, r3, dk),
                make_fake_stream(use_tvm_ffi_env_stream=True)]
        _COMPILED[key] = cute.compile(GdnDecode(*key), *args, options=f"--gpu-arch {arch or _arch()} --enable-tvm-ffi")
    return [_COMPILED[key]]


def solve(q, k, v, state, A_log, a, dt_bias, b, scale):
    (fn,) = _prepare(q, k, v, state, A_log, a, dt_bias, b, scale)
    batch, _, hk, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    o = torch.empty(batch, 1, hv, dv, dtype=q.dtype, device=q.device)
    s_out = torch.empty(state.shape, dtype=state.dtype, device=state.device)
    fn(q.contiguous().view(-1, dk), k.contiguous().view(-1, dk), v.contiguous().view(-1, dv),
       a.contiguous().view(-1), b.contiguous().view(-1), A_log.contiguous(), dt_bias.contiguous(),
       state.contiguous().view(-1, dk), o.view(-1, dv), s_out.view(-1, dk))
    return o, s_out
