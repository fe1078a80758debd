"""Valid on CPU: compiles a real CuTe DSL kernel at import (for sm_90a; it cannot run without a GPU) and answers in torch; the sealed process must let the DSL's compiler introspect and generate code, and record the kernel it built.

Problem: p28
DSL: cutedsl
Device: cpu
Expected: passed
Timeout: 300
"""
import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

THREADS = 128


@cute.kernel
def scale_kernel(mX: cute.Tensor, mO: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    row, _, _ = cute.arch.block_idx()
    for j in cutlass.range(tidx, mX.shape[1], THREADS):
        mO[row, j] = (Float32(mX[row, j]) * Float32(2.0)).to(mO.element_type)


@cute.jit
def scale(mX: cute.Tensor, mO: cute.Tensor, stream):
    scale_kernel(mX, mO).launch(grid=[mX.shape[0], 1, 1], block=[THREADS, 1, 1], stream=stream)


_rows, _cols = cute.sym_int32(), cute.sym_int32()
_matrix = lambda: make_fake_compact_tensor(cutlass.BFloat16, (_rows, _cols), stride_order=(1, 0))  # noqa: E731
COMPILED = cute.compile(scale, _matrix(), _matrix(), make_fake_stream(use_tvm_ffi_env_stream=True),
                        options="--gpu-arch sm_90a --enable-tvm-ffi")


def solve(x, residual, weight):
    s = x.float() + residual.float()
    return (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)
