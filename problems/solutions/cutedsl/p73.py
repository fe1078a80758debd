"""p73 gated DeltaNet multi-token (MTP) step over a pooled state (Qwen3-Next) in CuTe DSL: one fused, coalesced pass.

The pool is stored [slot, V, K] per value head (key dim last): row j (value j) is the key vector S[:, j], and the
update is independent per row.  8 lanes share a row, lane l holding the float4s l, l + 8, l + 16, l + 24 of it
(every warp-wide 16-byte load or store covers whole 128-byte lines); a warp holds 4 row groups of 4 rows
(64 registers of state), all its loads issued before anything else.  A CTA of 4 warps covers 64 rows of one
(value head, pool slot): 2 x 16 x 49 = 1568 CTAs, one read and one write of the pool, the SOL traffic.  The
second output is the input pool unchanged (a draft verification commits no state): each warp stores its rows
as loaded, before any token touches them, so every slot is copied bit for bit.  Each warp then finds the
requests that own its slot (a ballot over 32 indices at a time; distinct by construction: a repeated slot
would chain its requests in request order, where the reference starts each from the input pool) and runs
their draft tokens on the rows in registers, for o only: S' = alpha S, k.S' and q.S_new as 4 per-component FMA
partial sums per lane, (p0 + p1) + (p2 + p3), then a butterfly over the row's 8 lanes (xor 1, 2, 4);
delta = (v - k.S') beta; S_new = S' + k delta; o = (q.S_new) scale; the final states are dropped.  The per-token gates
alpha = exp(-exp(A_log) softplus(a + dt_bias)) and beta = sigmoid(b) are evaluated in fp64 by lanes 0 .. 2T - 1
of each warp (one gate each), rounded once, and broadcast by shuffles: no shared memory, no CTA barrier.
"""
import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Float64, Int32
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

WARPS = 4
G = 4                   # row groups per warp, loaded together


class GdnMtp:
    def __init__(self, k_heads: int, v_heads: int, dk: int, steps: int, scale: float):
        self.HK, self.HV, self.DK, self.T, self.scale = k_heads, v_heads, dk, steps, scale
        self.rep = v_heads // k_heads
        self.L = min(8, dk // 4)           # lanes per row
        self.M = dk // (4 * self.L)        # float4s per lane
        self.RG = 32 // self.L             # rows per row group (a warp-wide instruction)
        self.ROWS = WARPS * G * self.RG    # rows per CTA
        assert dk % (4 * self.L) == 0 and 32 % self.L == 0 and 2 * steps <= 32

    @cute.jit
    def __call__(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, s_in: cute.Tensor, idx: cute.Tensor,
                 alog: cute.Tensor, a: cute.Tensor, dtb: cute.Tensor, b: cute.Tensor, o: cute.Tensor,
                 s_out: cute.Tensor, stream):
        self.kernel(q, k, v, s_in, idx, alog, a, dtb, b, o, s_out).launch(
            grid=[(self.DK + self.ROWS - 1) // self.ROWS, self.HV, s_in.shape[0]], block=[32 * WARPS, 1, 1],
            stream=stream)

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

    @cute.jit
    def load_token(self, q, k, v, r, t, kh, h, li, first, kv, qv, vv):
        """Draft token t of request r: this lane's float4 slices of q and k, and v at its G rows, into registers."""
        ksrc = cute.zipped_divide(k[r, t, kh, None], (4,))
        qsrc = cute.zipped_divide(q[r, t, kh, None], (4,))
        for m in cutlass.range_constexpr(self.M):
            cute.autovec_copy(ksrc[None, li + self.L * m], kv[m])
            cute.autovec_copy(qsrc[None, li + self.L * m], qv[m])
        for gi in cutlass.range_constexpr(G):
            vv[gi] = v[r, t, h, cutlass.min(first + gi * self.RG, self.DK - 1)]

    @cute.kernel
    def kernel(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, s_in: cute.Tensor, idx: cute.Tensor,
               alog: cute.Tensor, a: cute.Tensor, dtb: cute.Tensor, b: cute.Tensor, o: cute.Tensor,
               s_out: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        rb, h, p = cute.arch.block_idx()
        L, M, RG, DK, T = self.L, self.M, self.RG, self.DK, self.T
        lane = tidx % 32
        li = lane % L
        first = rb * self.ROWS + (tidx // 32) * (G * RG) + lane // L    # this lane's row in group 0
        kh = h // self.rep
        S = [[cute.make_rmem_tensor((4,), Float32) for _ in range(M)] for _ in range(G)]
        for gi in cutlass.range_constexpr(G):                  # every state load first
            src = cute.zipped_divide(s_in[p, h, cutlass.min(first + gi * RG, DK - 1), None], (4,))
            for m in cutlass.range_constexpr(M):
                cute.autovec_copy(src[None, li + L * m], S[gi][m])
        for gi in cutlass.range_constexpr(G):                  # the output: the rows as loaded (a clamped row twice)
            dst = cute.zipped_divide(s_out[p, h, cutlass.min(first + gi * RG, DK - 1), None], (4,))
            for m in cutlass.range_constexpr(M):
                cute.autovec_copy(S[gi][m], dst[None, li + L * m])
        kv, kn = ([cute.make_rmem_tensor((4,), k.element_type) for _ in range(M)] for _ in range(2))
        qv, qn = ([cute.make_rmem_tensor((4,), q.element_type) for _ in range(M)] for _ in range(2))
        vv, vn = (cute.make_rmem_tensor((G,), v.element_type) for _ in range(2))
        nreq = idx.shape[0]
        for c in range(0, nreq, 32):                           # the requests that own this slot, in order
            own = cutlass.Boolean(False)
            if c + lane < nreq:
                own = idx[c + lane] == p
            mask = cute.arch.vote_ballot_sync(own)
            for bit in range(32):
                if ((mask >> bit) & 1) == 1:                   # warp-uniform
                    r = c + bit
                    # lane t < T: alpha of token t; lane T + t: beta of token t (fp64, rounded once)
                    tg = lane % T
                    x = Float64(a[r, tg, h].to(Float32)) + Float64(dtb[h])
                    sp = cute.math.log1p(cute.math.exp(x))
                    if x > 20.0:
                        sp = x
                    gate = Float32(cute.math.exp(-cute.math.exp(Float64(alog[h])) * sp))
                    if lane >= T:
                        gate = Float32(1.0 / (1.0 + cute.math.exp(-Float64(b[r, tg, h].to(Float32)))))
                    self.load_token(q, k, v, r, 0, kh, h, li, first, kv, qv, vv)
                    for t in range(T):                 # a real loop; the next token's q, k, v loaded a token ahead
                        decay = cute.arch.shuffle_sync(gate, offset=t)
                        beta = cute.arch.shuffle_sync(gate, offset=T + t)
                        self.load_token(q, k, v, r, cutlass.min(t + 1, T - 1), kh, h, li, first, kn, qn, vn)
                        kf = [kv[m].load().to(Float32) for m in range(M)]
                        qf = [qv[m].load().to(Float32) for m in range(M)]
                        vr = [vv[gi].to(Float32) for gi in range(G)]
                        for gi in cutlass.range_constexpr(G):
                            for m in cutlass.range_constexpr(M):
                                for e in cutlass.range_constexpr(4):
                                    S[gi][m][e] = S[gi][m][e] * decay
                            kS = self.dot(kf, S[gi])
                            delta = (vr[gi] - kS) * beta
                            for m in cutlass.range_constexpr(M):
                                for e in cutlass.range_constexpr(4):
                                    S[gi][m][e] = S[gi][m][e] + kf[m][e] * delta
                            acc = self.dot(qf, S[gi])
                            row = first + gi * RG
                            if row < DK and li == 0:
                                o[r, t, h, row] = (acc * self.scale).to(o.element_type)
                        for m in cutlass.range_constexpr(M):
                            kv[m].store(kn[m].load())
                            qv[m].store(qn[m].load())
                        vv.store(vn.load())


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _prepare(q, k, v, state_pool, indices, A_log, a, dt_bias, b, scale, arch=None):
    key = (q.shape[2], v.shape[2], q.shape[3], q.shape[1], float(scale))
    if key not in _COMPILED:
        assert q.shape[3] == v.shape[3] == state_pool.shape[3] == state_pool.shape[2]
        assert indices.dtype == torch.int32 and all(t.is_contiguous() for t in (q, k, v, state_pool, indices, a, b))
        hk, hv, dk, steps, _ = key
        bf = cutlass.BFloat16
        nb, npool = cute.sym_int(), cute.sym_int()
        row4 = lambda dt, n, h: make_fake_compact_tensor(dt, (n, steps, h, dk), stride_order=(3, 2, 1, 0),  # noqa: E731
                                                         assumed_align=16)
        gate = lambda: make_fake_compact_tensor(bf, (nb, steps, hv), stride_order=(2, 1, 0))  # noqa: E731
        pool = lambda: make_fake_compact_tensor(Float32, (npool, hv, dk, dk), stride_order=(3, 2, 1, 0),  # noqa: E731
                                                assumed_align=16)
        args = [row4(bf, nb, hk), row4(bf, nb, hk), row4(bf, nb, hv), pool(), make_fake_compact_tensor(Int32, (nb,)),
                make_fake_compact_tensor(Float32, (hv,)), gate(), make_fake_compact_tensor(Float32, (hv,)), gate(),
                row4(bf, nb, hv), pool(), make_fake_stream(use_tvm_ffi_env_stream=True)]
        _COMPILED[key] = cute.compile(GdnMtp(*key), *args, options=f"--gpu-arch {arch or _arch()} --enable-tvm-ffi")
    return [_COMPILED[key]]


def solve(q, k, v, state_pool, indices, A_log, a, dt_bias, b, scale):
    (fn,) = _prepare(q, k, v, state_pool, indices, A_log, a, dt_bias, b, scale)
    o = torch.empty_like(v)
    s_out = torch.empty_like(state_pool)
    fn(q, k, v, state_pool, indices, A_log, a, dt_bias, b, o, s_out)
    return o, s_out
