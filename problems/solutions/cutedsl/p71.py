"""p71 gated DeltaNet varlen prefill from per-sequence states (Qwen3-Next) in CuTe DSL, token by token in fp32.

S = state^T [K, V] per (sequence, v head); per token: S' = alpha S, u = k.S', S = S' + k (beta (v - u))^T,
o = scale * q.S (q, k used as given; v head h reads q/k head h // (Hv/Hk)).  The recurrence is
independent per value column j, and column j of S is row j of the stored [V, K] state (contiguous), so
the state is split over columns as in the shipped p62: a CTA handles 16 columns of one (v head,
sequence), a thread owns DK/8 consecutive rows of one column in registers for the whole sequence (one
vector load of the initial state, one vector store of the final state), and the 8 threads of a column
(adjacent lanes) combine k.S' and q.S with 3-step butterflies (each thread's part in 4 interleaved
partial sums).  Sequence bounds are read from cu_seqlens (int64) in the kernel; a sequence's tokens run
in order, the next token's q/k/v prefetched into registers.  The gates alpha = exp(-exp(A_log) *
softplus(a + dt_bias)) and beta = sigmoid(b) are evaluated in fp64 and rounded once, for 128 tokens at
a time (thread i: token i) into shared memory.  o is written per token (bf16).
"""
import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Float64, Int32
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream
from cutlass.memory import SmemAllocator

RT = 8                  # threads per column
COLS = 16               # columns per CTA
NT = RT * COLS          # threads per CTA = tokens per gate chunk


class GdnVarlen:
    def __init__(self, k_heads: int, v_heads: int, dk: int, dv: int, scale: float):
        self.HK, self.HV, self.DK, self.DV, self.scale = k_heads, v_heads, dk, dv, scale
        self.rep = v_heads // k_heads
        assert dk % RT == 0 and dv % COLS == 0
        self.R = dk // RT
        self.NP = min(4, self.R)             # partial sums per thread

    @cute.jit
    def __call__(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, s_in: cute.Tensor, alog: cute.Tensor,
                 a: cute.Tensor, dtb: cute.Tensor, b: cute.Tensor, cu: cute.Tensor, o: cute.Tensor,
                 s_out: cute.Tensor, stream):
        self.kernel(q, k, v, s_in, alog, a, dtb, b, cu, o, s_out).launch(
            grid=[self.DV // COLS, self.HV, cu.shape[0] - 1], block=[NT, 1, 1], stream=stream)

    @cute.jit
    def dot(self, x: cute.Tensor, S: cute.Tensor, part: cute.Tensor):
        """sum_r x[r] S[r] over the thread's rows (NP interleaved partial sums), then over the column's lanes."""
        for u in cutlass.range_constexpr(self.NP):
            part[u] = Float32(0.0)
        for r in cutlass.range_constexpr(self.R):
            part[r % self.NP] = part[r % self.NP] + x[r] * S[r]
        acc = part[0]
        if cutlass.const_expr(self.NP == 4):
            acc = (part[0] + part[1]) + (part[2] + part[3])
        elif cutlass.const_expr(self.NP == 2):
            acc = part[0] + part[1]
        for sh in cutlass.range_constexpr(3):
            acc = acc + cute.arch.shuffle_sync_bfly(acc, offset=1 << sh)
        return acc

    @cute.kernel
    def kernel(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, s_in: cute.Tensor, alog: cute.Tensor,
               a: cute.Tensor, dtb: cute.Tensor, b: cute.Tensor, cu: cute.Tensor, o: cute.Tensor,
               s_out: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        cb, h, n = cute.arch.block_idx()
        R, HK, HV = self.R, self.HK, self.HV
        rc = tidx % RT
        j = cb * COLS + tidx // RT
        kh = h // self.rep
        start = Int32(cu[n])
        end = Int32(cu[n + 1])
        srow = (n * HV + h) * self.DV + j
        smem = SmemAllocator()
        gs = smem.allocate_tensor(Float32, cute.make_layout(2 * NT), byte_alignment=16)  # alpha, beta
        S = cute.make_rmem_tensor((R,), Float32)
        cute.autovec_copy(cute.zipped_divide(s_in[srow, None], (R,))[None, rc], S)
        part = cute.make_rmem_tensor((self.NP,), Float32)
        nk = cute.make_rmem_tensor((R,), k.element_type)
        nq = cute.make_rmem_tensor((R,), q.element_type)
        ck = cute.make_rmem_tensor((R,), k.element_type)
        cq = cute.make_rmem_tensor((R,), q.element_type)
        nv = Float32(0.0)
        if start < end:
            cute.autovec_copy(cute.zipped_divide(k[start * HK + kh, None], (R,))[None, rc], nk)
            cute.autovec_copy(cute.zipped_divide(q[start * HK + kh, None], (R,))[None, rc], nq)
            nv = v[start * HV + h, j].to(Float32)
        for t in range(start, end):
            tt = (t - start) % NT
            if tt == 0:                      # CTA-uniform: gates of the next NT tokens, thread i: token t + i
                cute.arch.sync_threads()     # everyone is done with the previous chunk's gates
                e = t + tidx
                if e < end:
                    x = Float64(a[e * HV + h].to(Float32)) + Float64(dtb[h])
                    sp = cute.math.log1p(cute.math.exp(x))
                    if x > 20.0:
                        sp = x
                    gs[tidx] = Float32(cute.math.exp(-cute.math.exp(Float64(alog[h])) * sp))
                    gs[NT + tidx] = Float32(1.0 / (1.0 + cute.math.exp(-Float64(b[e * HV + h].to(Float32)))))
                cute.arch.sync_threads()
            ck.store(nk.load())
            cq.store(nq.load())
            vt = nv
            if t + 1 < end:
                cute.autovec_copy(cute.zipped_divide(k[(t + 1) * HK + kh, None], (R,))[None, rc], nk)
                cute.autovec_copy(cute.zipped_divide(q[(t + 1) * HK + kh, None], (R,))[None, rc], nq)
                nv = v[(t + 1) * HV + h, j].to(Float32)
            alpha = gs[tt]
            beta = gs[NT + tt]
            kf = ck.load().to(Float32)
            qf = cq.load().to(Float32)
            for r in cutlass.range_constexpr(R):
                S[r] = S[r] * alpha
            kS = self.dot(kf, S, part)
            delta = (vt - kS) * beta
            for r in cutlass.range_constexpr(R):
                S[r] = S[r] + kf[r] * delta
            ot = self.dot(qf, S, part)
            if rc == 0:
                o[t * HV + h, j] = (ot * self.scale).to(o.element_type)
        cute.autovec_copy(S, cute.zipped_divide(s_out[srow, None], (R,))[None, rc])


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _prepare(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, arch=None):
    key = (q.shape[1], v.shape[1], q.shape[2], v.shape[2], float(scale))
    assert state.shape[2] == v.shape[2] and state.shape[3] == q.shape[2]
    if key not in _COMPILED:
        hk, hv, dk, dv, _ = key
        bf = cutlass.BFloat16
        r1, r2, r3, r4 = (cute.sym_int() for _ in range(4))
        mk = lambda dt, r, c: make_fake_compact_tensor(dt, (r, c), stride_order=(1, 0), assumed_align=16)  # noqa: E731
        vec = make_fake_compact_tensor
        args = [mk(bf, r1, dk), mk(bf, r1, dk), mk(bf, r2, dv), mk(Float32, r3, dk), vec(Float32, (hv,)),
                vec(bf, (r2,)), vec(Float32, (hv,)), vec(bf, (r2,)), vec(cutlass.Int64, (r4,)), mk(bf, r2, dv),
                mk(Float32, r3, dk), make_fake_stream(use_tvm_ffi_env_stream=True)]
        _COMPILED[key] = cute.compile(GdnVarlen(*key), *args, options=f"--gpu-arch {arch or _arch()} --enable-tvm-ffi")
    return [_COMPILED[key]]


def solve(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale):
    (fn,) = _prepare(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale)
    dk, dv = q.shape[2], v.shape[2]
    o = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    s_out = torch.empty(state.shape, dtype=state.dtype, device=state.device)
    fn(q.contiguous().view(-1, dk), k.contiguous().view(-1, dk), v.contiguous().view(-1, dv),
       state.contiguous().view(-1, dk), A_log.contiguous(), a.contiguous().view(-1), dt_bias.contiguous(),
       b.contiguous().view(-1), cu_seqlens.contiguous(), o.view(-1, dv), s_out.view(-1, dk))
    return o, s_out
