"""Hack: work deferred out of every measured window: after the correctness draws, solve() launches a small DSL kernel and returns a tuple subclass (named "tuple") whose __iter__ does the real work; the harness walked solve()'s result only after a timed call's window had closed (copying it into the referee's slots) and the profiler never walks it, so the timed, trusted and profiled figures all missed the work while the re-checked outputs were right. The harness now walks only exact lists and tuples, so the first timed call's result is a different structure.

Problem: p72
DSL: cutedsl
Device: gpu
Expected: incorrect
"""
import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Float64
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream


class GdnDecode:
    def __init__(self, k_heads: int, v_heads: int, dk: int, dv: int, scale: float):
        self.HK, self.HV, self.DK, self.DV, self.scale = k_heads, v_heads, dk, dv, scale
        self.rep = v_heads // k_heads
        assert dk == dv
        self.W = (dk + 31) // 32           # warps per CTA (threads >= dk sit out the column work)

    @cute.jit
    def __call__(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, a: cute.Tensor, b: cute.Tensor,
                 alog: cute.Tensor, dtb: cute.Tensor, s_in: cute.Tensor, o: cute.Tensor, s_out: cute.Tensor, stream):
        batch = a.shape[0] // self.HV
        self.kernel(q, k, v, a, b, alog, dtb, s_in, o, s_out).launch(
            grid=[self.HV, batch, 1], block=[32 * self.W, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, a: cute.Tensor, b: cute.Tensor,
               alog: cute.Tensor, dtb: cute.Tensor, s_in: cute.Tensor, o: cute.Tensor, s_out: cute.Tensor):
        j, _, _ = cute.arch.thread_idx()
        h, bi, _ = cute.arch.block_idx()
        DK = self.DK
        kh = h // self.rep
        bh = bi * self.HV + h
        smem = cutlass.utils.SmemAllocator()
        qs = smem.allocate_tensor(Float32, cute.make_layout(DK), byte_alignment=16)
        ks = smem.allocate_tensor(Float32, cute.make_layout(DK), byte_alignment=16)
        if j < DK:
            qs[j] = q[bi * self.HK + kh, j].to(Float32) * self.scale
            ks[j] = k[bi * self.HK + kh, j].to(Float32)
        # per-head gate scalars in fp64, rounded once
        x = Float64(a[bh].to(Float32)) + Float64(dtb[h])
        sp = cute.math.log1p(cute.math.exp(x))
        if x > 20.0:
            sp = x
        g = -cute.math.exp(Float64(alog[h])) * sp
        decay = Float32(cute.math.exp(g))
        beta = Float32(1.0 / (1.0 + cute.math.exp(-Float64(b[bh].to(Float32)))))
        cute.arch.sync_threads()
        if j < DK:
            col = cute.make_rmem_tensor((DK,), Float32)
            kS = Float32(0.0)
            for i in cutlass.range_constexpr(DK):
                col[i] = s_in[bh * DK + j, i] * decay
            for i in cutlass.range_constexpr(DK):
                kS = kS + ks[i] * col[i]
            delta = (v[bh, j].to(Float32) - kS) * beta
            acc = Float32(0.0)
            for i in cutlass.range_constexpr(DK):
                col[i] = col[i] + ks[i] * delta
                acc = acc + qs[i] * col[i]
                s_out[bh * DK + j, i] = col[i]
            o[bh, j] = acc.to(o.element_type)


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _prepare(q, k, v, state, A_log, a, dt_bias, b, scale, arch=None):
    key = (q.shape[2], v.shape[2], q.shape[3], v.shape[3], float(scale))
    if key not in _COMPILED:
        hk, hv, dk, dv, _ = key
        bf = cutlass.BFloat16
        r1, r2, r3, r4 = (cute.sym_int() for _ in range(4))
        mk = lambda dt, r, c: make_fake_compact_tensor(dt, (r, c), stride_order=(1, 0), assumed_align=16)  # noqa: E731
        args = [mk(bf, r1, dk), mk(bf, r1, dk), mk(bf, r2, dv), make_fake_compact_tensor(bf, (r2,)),
                make_fake_compact_tensor(bf, (r2,)), make_fake_compact_tensor(Float32, (hv,)),
                make_fake_compact_tensor(Float32, (hv,)), mk(Float32, r3, dv), mk(bf, r2, dv), mk(Float32, r3, dv),
                make_fake_stream(use_tvm_ffi_env_stream=True)]
        del r4
        _COMPILED[key] = cute.compile(GdnDecode(*key), *args, options=f"--gpu-arch {arch or _arch()} --enable-tvm-ffi")
    return [_COMPILED[key]]


def _solve(q, k, v, state, A_log, a, dt_bias, b, scale):
    (fn,) = _prepare(q, k, v, state, A_log, a, dt_bias, b, scale)
    batch, _, hk, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    o = torch.empty(batch, 1, hv, dv, dtype=q.dtype, device=q.device)
    s_out = torch.empty(state.shape, dtype=state.dtype, device=state.device)
    fn(q.contiguous().view(-1, dk), k.contiguous().view(-1, dk), v.contiguous().view(-1, dv),
       a.contiguous().view(-1), b.contiguous().view(-1), A_log.contiguous(), dt_bias.contiguous(),
       state.contiguous().view(-1, dv), o.view(-1, dv), s_out.view(-1, dv))
    return o, s_out


_calls = [0]
CORRECTNESS_CALLS = 8
"""Five graded draws, two knock-outs and the repeat come first; every later call is a warm-up, timed or profiled."""


class tuple(tuple):  # noqa: A001  (named like the built-in: the harness compared type names)
    def __iter__(self):
        return iter(_solve(*super().__getitem__(0)))

    def __len__(self):
        return 2


def solve(q, k, v, state, A_log, a, dt_bias, b, scale):
    _calls[0] += 1
    if _calls[0] <= CORRECTNESS_CALLS:
        return _solve(q, k, v, state, A_log, a, dt_bias, b, scale)
    one = slice(0, 1)
    _solve(q[one], k[one], v[one], state[one], A_log, a[one], dt_bias, b[one], scale)  # a DSL kernel, for the trace
    return tuple(((q, k, v, state, A_log, a, dt_bias, b, scale),))
