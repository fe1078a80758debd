"""p28 fused residual add + RMSNorm (bf16) in CuTe DSL: one CTA per row, row kept in registers.

s = x + residual (fp32); out = s * rsqrt(mean(s^2) + eps) * weight, rounded once.  One read of
x/residual, one write of out: 3 bf16 streams, the SOL traffic.
"""
import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

EPS = 1e-5
THREADS = 128          # 4 warps per row
VEC = 8                # 8 x bf16 = one 128-bit access


class AddRMSNorm:
    def __init__(self, n: int):
        self.N = n

    @cute.jit
    def __call__(self, mX: cute.Tensor, mR: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor, stream):
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), mX.element_type, num_bits_per_copy=128)
        tiled = cute.make_tiled_copy_tv(atom, cute.make_layout(THREADS), cute.make_layout(VEC))
        self.kernel(mX, mR, mW, mO, tiled).launch(grid=[mX.shape[0], 1, 1], block=[THREADS, 1, 1],
                                                      stream=stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mR: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor,
               tiled: cute.TiledCopy):
        tidx, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        thr = tiled.get_slice(tidx)
        gX = cute.local_tile(mX, tiler=(1, self.N), coord=(row, 0))[0, None]
        gR = cute.local_tile(mR, tiler=(1, self.N), coord=(row, 0))[0, None]
        gO = cute.local_tile(mO, tiler=(1, self.N), coord=(row, 0))[0, None]
        tX, tR, tW = thr.partition_S(gX), thr.partition_S(gR), thr.partition_S(mW)
        tO = thr.partition_D(gO)
        rX, rR, rW = cute.make_fragment_like(tX), cute.make_fragment_like(tR), cute.make_fragment_like(tW)
        rX.fill(0)
        rR.fill(0)
        rW.fill(0)
        for i in cutlass.range_constexpr(cute.size(rX, mode=[1])):
            if (i * THREADS + tidx) * VEC < self.N:
                cute.autovec_copy(tX[None, i], rX[None, i])
                cute.autovec_copy(tR[None, i], rR[None, i])
                cute.autovec_copy(tW[None, i], rW[None, i])
        s = rX.load().to(Float32) + rR.load().to(Float32)
        ss = (s * s).reduce(cute.ReductionOp.ADD, Float32(0.0), reduction_profile=0)
        ss = cute.arch.warp_reduction_sum(ss)
        red = cutlass.utils.SmemAllocator().allocate_tensor(Float32, cute.make_layout(THREADS // 32))
        if tidx % 32 == 0:
            red[tidx // 32] = ss
        cute.arch.sync_threads()
        tot = Float32(0.0)
        for w in cutlass.range_constexpr(THREADS // 32):
            tot = tot + red[w]
        inv = cute.math.rsqrt(tot / self.N + EPS)
        y = s * inv * rW.load().to(Float32)
        rO = cute.make_fragment_like(rX)
        rO.store(y.to(mO.element_type))
        for i in cutlass.range_constexpr(cute.size(rX, mode=[1])):
            if (i * THREADS + tidx) * VEC < self.N:
                cute.autovec_copy(rO[None, i], tO[None, i])


_COMPILED = {}
_EXTRA = ""


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _prepare(x, residual, weight, arch=None):
    n = x.shape[-1]
    key = (n, x.dtype)
    if key not in _COMPILED:
        assert n % VEC == 0
        dt = cutlass.BFloat16
        m = cute.sym_int()
        fx = make_fake_compact_tensor(dt, (m, n), stride_order=(1, 0), assumed_align=16)
        fw = make_fake_compact_tensor(dt, (n,), assumed_align=16)
        _COMPILED[key] = cute.compile(AddRMSNorm(n), fx, fx, fw, fx,
                                      make_fake_stream(use_tvm_ffi_env_stream=True),
                                      options=f"--gpu-arch {arch or _arch()} --enable-tvm-ffi" + _EXTRA)
    return [_COMPILED[key]]


def solve(x, residual, weight):
    (fn,) = _prepare(x, residual, weight)
    n = x.shape[-1]
    x2, r2 = x.reshape(-1, n).contiguous(), residual.reshape(-1, n).contiguous()
    out = torch.empty_like(x2)
    fn(x2, r2, weight.contiguous(), out)
    return out.view(x.shape)
