"""p74 DeltaNet delta-rule recurrence (T=1024) in CuTe DSL, token by token in fp32.

The recurrence is independent per value column j (S[:, j] only ever sees k, q, beta and v[:, j]), so
the state is split over columns: a CTA handles 16 columns of one (batch, head), a thread owns
DK/8 rows of one column in registers for the whole sequence, and the 8 threads of a column
(adjacent lanes) combine k.S, q.S and the L2 norms with 3-step shuffles.  The next token's q/k/v/beta
are loaded while the current one is processed.  o is written per token (bf16), the state at the end.
"""
import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

L2_EPS = 1e-6
RT = 8                  # threads per column
COLS = 16               # columns per CTA


class DeltaRule:
    def __init__(self, dk: int, dv: int, seq: int):
        self.DK, self.DV, self.T = dk, dv, seq
        assert dk % RT == 0 and dv % COLS == 0
        self.R = dk // RT
        assert self.R % 2 == 0

    @cute.jit
    def __call__(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, beta: cute.Tensor, s0: cute.Tensor,
                 o: cute.Tensor, s1: cute.Tensor, stream):
        bh = s0.shape[0] // self.DK
        self.kernel(q, k, v, beta, s0, o, s1).launch(grid=[self.DV // COLS, bh, 1], block=[RT * COLS, 1, 1],
                                                     stream=stream)

    @cute.kernel
    def kernel(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, beta: cute.Tensor, s0: cute.Tensor,
               o: cute.Tensor, s1: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        cb, bh, _ = cute.arch.block_idx()
        R = self.R
        rc = tidx % RT
        j = cb * COLS + tidx // RT
        S = cute.make_rmem_tensor((R,), Float32)
        for r in cutlass.range_constexpr(R):
            S[r] = s0[bh * self.DK + rc * R + r, j]
        nk = cute.make_rmem_tensor((R,), k.element_type)
        nq = cute.make_rmem_tensor((R,), q.element_type)
        ck = cute.make_rmem_tensor((R,), k.element_type)
        cq = cute.make_rmem_tensor((R,), q.element_type)
        row0 = bh * self.T
        cute.autovec_copy(cute.zipped_divide(k[row0, None], (R,))[None, rc], nk)
        cute.autovec_copy(cute.zipped_divide(q[row0, None], (R,))[None, rc], nq)
        nv = v[row0, j].to(Float32)
        nb = beta[row0].to(Float32)
        qscale = self.DK ** -0.5
        for t in range(self.T):
            ck.store(nk.load())
            cq.store(nq.load())
            vt = nv
            bt = nb
            if t + 1 < self.T:
                cute.autovec_copy(cute.zipped_divide(k[row0 + t + 1, None], (R,))[None, rc], nk)
                cute.autovec_copy(cute.zipped_divide(q[row0 + t + 1, None], (R,))[None, rc], nq)
                nv = v[row0 + t + 1, j].to(Float32)
                nb = beta[row0 + t + 1].to(Float32)
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
                kS = kS + kn[r] * S[r]
            for sh in cutlass.range_constexpr(3):
                kS = kS + cute.arch.shuffle_sync_bfly(kS, offset=1 << sh)
            delta = (vt - kS) * bt
            ot = Float32(0.0)
            for r in cutlass.range_constexpr(R):
                S[r] = S[r] + kn[r] * delta
                ot = ot + (qf[r] * rq * qscale) * S[r]
            for sh in cutlass.range_constexpr(3):
                ot = ot + cute.arch.shuffle_sync_bfly(ot, offset=1 << sh)
            if rc == 0:
                o[row0 + t, j] = ot.to(o.element_type)
        for r in cutlass.range_constexpr(R):
            s1[bh * self.DK + rc * R + r, j] = S[r]


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _prepare(q, k, v, beta, initial_state, arch=None):
    key = (q.shape[3], v.shape[3], q.shape[2])
    if key not in _COMPILED:
        dk, dv, _ = key
        bf = cutlass.BFloat16
        r1, r2 = cute.sym_int(), cute.sym_int()
        mk = lambda dt, r, c: make_fake_compact_tensor(dt, (r, c), stride_order=(1, 0), assumed_align=16)  # noqa: E731
        args = [mk(bf, r1, dk), mk(bf, r1, dk), mk(bf, r1, dv), make_fake_compact_tensor(bf, (r1,)),
                mk(Float32, r2, dv), mk(bf, r1, dv), mk(Float32, r2, dv), make_fake_stream(use_tvm_ffi_env_stream=True)]
        _COMPILED[key] = cute.compile(DeltaRule(*key), *args, options=f"--gpu-arch {arch or _arch()} --enable-tvm-ffi")
    return [_COMPILED[key]]


def solve(q, k, v, beta, initial_state):
    (fn,) = _prepare(q, k, v, beta, initial_state)
    batch, heads, seq, dk = q.shape
    dv = v.shape[3]
    o = torch.empty(batch, heads, seq, dv, dtype=q.dtype, device=q.device)
    s1 = torch.empty(initial_state.shape, dtype=initial_state.dtype, device=q.device)
    fn(q.contiguous().view(-1, dk), k.contiguous().view(-1, dk), v.contiguous().view(-1, dv),
       beta.contiguous().view(-1), initial_state.contiguous().view(-1, dv), o.view(-1, dv), s1.view(-1, dv))
    return o, s1
