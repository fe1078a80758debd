"""p66 RWKV-4 WKV recurrence with running-max stabilisation in CuTe DSL: a thread per (sequence, channel).

Each thread carries its channel's (num, max, den) state in registers through all time steps, reading
key[b, t, c] and value[b, t, c] (a warp reads 128 contiguous bytes per step) and writing wkv[b, t, c]:
one read of key/value and one write of wkv, the SOL traffic.  Steps are processed 8 at a time with
the 16 loads issued first.  One of each step's two exponentials is exp(0) = 1 (the running max is one
of its two arguments), so a step needs two exponentials, not four; both use the accurate exp and
IEEE division, as the fp32 reference does.
"""
import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

THREADS = 256
UNROLL = 8


class WKV:
    @cute.jit
    def __call__(self, td: cute.Tensor, key: cute.Tensor, tf: cute.Tensor, value: cute.Tensor, num: cute.Tensor,
                 mx: cute.Tensor, den: cute.Tensor, out: cute.Tensor, num_o: cute.Tensor, mx_o: cute.Tensor,
                 den_o: cute.Tensor, stream):
        lanes = key.shape[0] * key.shape[2]
        self.kernel(td, key, tf, value, num, mx, den, out, num_o, mx_o, den_o).launch(
            grid=[(lanes + THREADS - 1) // THREADS, 1, 1], block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, td: cute.Tensor, key: cute.Tensor, tf: cute.Tensor, value: cute.Tensor, num: cute.Tensor,
               mx: cute.Tensor, den: cute.Tensor, out: cute.Tensor, num_o: cute.Tensor, mx_o: cute.Tensor,
               den_o: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        nb, steps, nc = key.shape
        gid = bidx * THREADS + tidx
        if gid < nb * nc:
            b = gid // nc
            c = gid % nc
            w = -cute.math.exp(td[c])
            u = tf[c]
            s_num = num[b, c]
            s_max = mx[b, c]
            s_den = den[b, c]
            rk = cute.make_rmem_tensor((UNROLL,), Float32)
            rv = cute.make_rmem_tensor((UNROLL,), Float32)
            for chunk in range((steps + UNROLL - 1) // UNROLL):
                t0 = Int32(chunk) * UNROLL
                for i in cutlass.range_constexpr(UNROLL):
                    rk[i] = Float32(0.0)
                    rv[i] = Float32(0.0)
                    if t0 + i < steps:
                        rk[i] = key[b, t0 + i, c]
                        rv[i] = value[b, t0 + i, c]
                for i in cutlass.range_constexpr(UNROLL):
                    if t0 + i < steps:
                        kt = rk[i]
                        vt = rv[i]
                        uk = u + kt
                        # p = max(max, u + k): e1 = exp(max - p), e2 = exp(u + k - p); one of them is exp(0)
                        d = cute.math.exp(-cute.math.abs(s_max - uk))
                        res = Float32(0.0)
                        if s_max >= uk:
                            res = (s_num + d * vt) / (s_den + d)
                        else:
                            res = (d * s_num + vt) / (d * s_den + Float32(1.0))
                        out[b, t0 + i, c] = res
                        ww = s_max + w
                        d2 = cute.math.exp(-cute.math.abs(ww - kt))
                        if ww >= kt:
                            s_num = s_num + d2 * vt
                            s_den = s_den + d2
                            s_max = ww
                        else:
                            s_num = d2 * s_num + vt
                            s_den = d2 * s_den + Float32(1.0)
                            s_max = kt
            num_o[b, c] = s_num
            mx_o[b, c] = s_max
            den_o[b, c] = s_den


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _prepare(time_decay, key, time_first, value, num, mx, den, arch=None):
    if "wkv" not in _COMPILED:
        f32 = cutlass.Float32
        nb, steps, nc = cute.sym_int(), cute.sym_int(), cute.sym_int()
        fv = make_fake_compact_tensor(f32, (nc,))
        fx = make_fake_compact_tensor(f32, (nb, steps, nc), stride_order=(2, 1, 0))
        fs = make_fake_compact_tensor(f32, (nb, nc), stride_order=(1, 0))
        _COMPILED["wkv"] = cute.compile(WKV(), fv, fx, fv, fx, fs, fs, fs, fx, fs, fs, fs,
                                        make_fake_stream(use_tvm_ffi_env_stream=True),
                                        options=f"--gpu-arch {arch or _arch()} --enable-tvm-ffi")
    return [_COMPILED["wkv"]]


def solve(time_decay, key, time_first, value, num, mx, den):
    (fn,) = _prepare(time_decay, key, time_first, value, num, mx, den)
    out = torch.empty_like(key)
    num_o, mx_o, den_o = torch.empty_like(num), torch.empty_like(mx), torch.empty_like(den)
    if num.numel():
        fn(time_decay.contiguous(), key.contiguous(), time_first.contiguous(), value.contiguous(), num.contiguous(),
           mx.contiguous(), den.contiguous(), out, num_o, mx_o, den_o)
    return out, num_o, mx_o, den_o
