"""Partial DSL: a real CuTe DSL kernel does a trivial but load-bearing part (it converts the 4096-element weight to fp32, and the answer uses it); eager torch does the add and the norm. Passes the paper policy with its small DSL share recorded; fails strict.

Problem: p28
DSL: cutedsl
Device: gpu
Expected: passed
"""
import torch
import cutlass
import cutlass.cute as cute
from cutlass import Float32
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

THREADS = 128
_compiled = {}


@cute.kernel
def widen_kernel(mW: cute.Tensor, mO: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * THREADS + tidx
    if i < mW.shape[0]:
        mO[i] = Float32(mW[i])


@cute.jit
def widen(mW: cute.Tensor, mO: cute.Tensor, stream):
    widen_kernel(mW, mO).launch(grid=[(mW.shape[0] + THREADS - 1) // THREADS, 1, 1], block=[THREADS, 1, 1],
                                stream=stream)


def _kernel(arch: str):
    if arch not in _compiled:
        n = cute.sym_int32()
        _compiled[arch] = cute.compile(widen, make_fake_compact_tensor(cutlass.BFloat16, (n,)),
                                       make_fake_compact_tensor(cutlass.Float32, (n,)),
                                       make_fake_stream(use_tvm_ffi_env_stream=True),
                                       options=f"--gpu-arch {arch} --enable-tvm-ffi")
    return _compiled[arch]


def solve(x, residual, weight):
    major, minor = torch.cuda.get_device_capability(x.device)
    w = torch.empty(weight.numel(), dtype=torch.float32, device=weight.device)
    _kernel(f"sm_{major}{minor}" + ("a" if major >= 9 else ""))(weight.contiguous(), w)
    s = x.float() + residual.float()
    return (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * w).to(x.dtype)
