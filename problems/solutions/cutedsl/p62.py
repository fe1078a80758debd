"""p62 chunked gated delta rule (Gated DeltaNet prefill, Qwen3-Next) in CuTe DSL, token by token in fp32.

The reference evaluates the recurrence in chunks of 64 (WY / UT form); the answer is the recurrence
S_t = a_t S_{t-1} + b_t k_t (v_t - a_t S_{t-1}^T k_t)^T, o_t = S_t^T (scale q_t) from a zero state,
with q and k L2-normalised in the kernel.  It is independent per value column j, so the state is
split over columns: a CTA handles 16 columns of one (sequence, v head), a thread owns DK/8 rows of
one column in registers for the whole sequence, and the 8 threads of a column (adjacent lanes)
combine k.S, q.S and the L2 norms with 3-step shuffles.  The v head reads q/k head h // (Hv/Hk).
The next token's q/k/v/g/beta are loaded while the current one is processed; a_t = exp(g_t) is the
accurate expf.  o is written per token (bf16).
"""
import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

L2_EPS = 1e-6
RT = 8                  # threads per column
COLS = 16               # columns per CTA


class GatedDeltaRule:
    def __init__(self, k_heads: int, v_heads: int, dk: int, dv: int, seq: int, scale: float):
        self.HK, self.HV, self.DK, self.DV, self.T, self.scale = k_heads, v_heads, dk, dv, seq, scale
        self.rep = v_heads // k_heads
        assert dk % RT == 0 and dv % COLS == 0
        self.R = dk // RT
        assert self.R % 2 == 0

    @cute.jit
    def __call__(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, g: cute.Tensor, beta: cute.Tensor,
                 o: cute.Tensor, stream):
        bh = v.shape[0] // self.T
        self.kernel(q, k, v, g, beta, o).launch(grid=[self.DV // COLS, bh, 1], block=[RT * COLS, 1, 1],
                                                stream=stream)

    @cute.kernel
    def kernel(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, g: cute.Tensor, beta: cute.Tensor,
               o: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        cb, bh, _ = cute.arch.block_idx()
        R = self.R
        rc = tidx % RT
        j = cb * COLS + tidx // RT
        S = cute.make_rmem_tensor((R,), Float32)
        for r in cutlass.range_constexpr(R):
            S[r] = Float32(0.0)
        nk = cute.make_rmem_tensor((R,), k.element_type)
        nq = cute.make_rmem_tensor((R,), q.element_type)
        ck = cute.make_rmem_tensor((R,), k.element_type)
        cq = cute.make_rmem_tensor((R,), q.element_type)
        krow0 = ((bh // self.HV) * self.HK + (bh % self.HV) // self.rep) * self.T
        row0 = bh * self.T
        cute.autovec_copy(cute.zipped_divide(k[krow0, None], (R,))[None, rc], nk)
        cute.autovec_copy(cute.zipped_divide(q[krow0, None], (R,))[None, rc], nq)
        nv = v[row0, j].to(Float32)
        ng = g[row0].to(Float32)
        nb = beta[row0].to(Float32)
        for t in range(self.T):
            ck.store(nk.load())
            cq.store(nq.load())
            vt = nv
            gt = ng
            bt = nb
            if t + 1 < self.T:
                cute.autovec_copy(cute.zipped_divide(k[krow0 + t + 1, None], (R,))[None, rc], nk)
                cute.autovec_copy(cute.zipped_divide(q[krow0 + t + 1, None], (R,))[None, rc], nq)
                nv = v[row0 + t + 1, j].to(Float32)
                ng = g[row0 + t + 1].to(Float32)
                nb = beta[row0 + t + 1].to(Float32)
            alpha = cute.math.exp(gt)
            kf = ck.load().to(Float32)
            qf = cq.load().to(Float32)
            sk = (kf * kf).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
            sq = (qf * qf).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
            for sh in cutlass.range_constexpr(3):
                sk = sk + cute.arch.shuffle_sync_bfly(sk, offset=1 << sh)
                sq = sq + cute.arch.shuffle_sync_bfly(sq, offset=1 << sh)
            rk = cute.math.rsqrt(sk + L2_EPS)
            rq = cute.math.rsqrt(sq + L2_EPS)
            kn = cute.make_rmem_tensor((R,), Float32)
            kS = Float32(0.0)
            for r in cutlass.range_constexpr(R):
                kn[r] = kf[r] * rk
                S[r] = S[r] * alpha
                kS = kS + kn[r] * S[r]
            for sh in cutlass.range_constexpr(3):
                kS = kS + cute.arch.shuffle_sync_bfly(kS, offset=1 << sh)
            delta = (vt - kS) * bt
            ot = Float32(0.0)
            for r in cutlass.range_constexpr(R):
                S[r] = S[r] + kn[r] * delta
                ot = ot + (qf[r] * rq * self.scale) * S[r]
            for sh in cutlass.range_constexpr(3):
                ot = ot + cute.arch.shuffle_sync_bfly(ot, offset=1 << sh)
            if rc == 0:
                o[row0 + t, j] = ot.to(o.element_type)


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _prepare(q, k, v, g, beta, scale, arch=None):
    key = (q.shape[1], v.shape[1], q.shape[3], v.shape[3], q.shape[2], float(scale))
    if key not in _COMPILED:
        _, _, dk, dv, _, _ = key
        bf = cutlass.BFloat16
        r1, r2 = cute.sym_int(), cute.sym_int()
        mk = lambda dt, r, c: make_fake_compact_tensor(dt, (r, c), stride_order=(1, 0), assumed_align=16)  # noqa: E731
        args = [mk(bf, r1, dk), mk(bf, r1, dk), mk(bf, r2, dv), make_fake_compact_tensor(bf, (r2,)),
                make_fake_compact_tensor(bf, (r2,)), mk(bf, r2, dv), make_fake_stream(use_tvm_ffi_env_stream=True)]
        _COMPILED[key] = cute.compile(GatedDeltaRule(*key), *args,
                                      options=f"--gpu-arch {arch or _arch()} --enable-tvm-ffi")
    return [_COMPILED[key]]


def solve(q, k, v, g, beta, scale):
    (fn,) = _prepare(q, k, v, g, beta, scale)
    dk, dv = q.shape[3], v.shape[3]
    o = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    fn(q.contiguous().view(-1, dk), k.contiguous().view(-1, dk), v.contiguous().view(-1, dv),
       g.contiguous().view(-1), beta.contiguous().view(-1), o.view(-1, dv))
    return o
