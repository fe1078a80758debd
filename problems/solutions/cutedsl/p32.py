"""p32 fp32 SwiGLU MLP (Parakeet) with a CuTe DSL gating kernel.

The two fp32 GEMMs stay in cuBLAS (fp32, no TF32, as the reference); the CuTe kernel computes the
gated activation a = silu(h[:, :I]) * h[:, I:] from the gate-up projection h (128-bit loads, fp32
math), and a feeds the down projection.
"""
import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

THREADS = 256
VEC = 4


class SwiGLU:
    def __init__(self, inter: int):
        self.I = inter
        self.nv = inter // VEC        # vectors per output row

    @cute.jit
    def __call__(self, h: cute.Tensor, a: cute.Tensor, stream):
        total = a.shape[0] * self.nv
        self.kernel(h, a).launch(grid=[(total + THREADS - 1) // THREADS, 1, 1], block=[THREADS, 1, 1],
                                 stream=stream)

    @cute.kernel
    def kernel(self, h: cute.Tensor, a: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        v = bidx * THREADS + tidx
        if v < a.shape[0] * self.nv:
            row = v // self.nv
            c = v % self.nv
            hrow = cute.zipped_divide(h[row, None], (VEC,))
            rg = cute.make_rmem_tensor((VEC,), Float32)
            ru = cute.make_rmem_tensor((VEC,), Float32)
            cute.autovec_copy(hrow[None, c], rg)
            cute.autovec_copy(hrow[None, self.nv + c], ru)
            g = rg.load()
            y = g / (1.0 + cute.math.exp(-g)) * ru.load()
            ro = cute.make_rmem_tensor((VEC,), Float32)
            ro.store(y)
            cute.autovec_copy(ro, cute.zipped_divide(a[row, None], (VEC,))[None, c])


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _prepare(x, w_gate_up, w_down, arch=None):
    inter = w_gate_up.shape[0] // 2
    if inter not in _COMPILED:
        assert inter % VEC == 0
        m = cute.sym_int()
        fh = make_fake_compact_tensor(Float32, (m, 2 * inter), stride_order=(1, 0), assumed_align=16)
        fa = make_fake_compact_tensor(Float32, (m, inter), stride_order=(1, 0), assumed_align=16)
        _COMPILED[inter] = cute.compile(SwiGLU(inter), fh, fa, make_fake_stream(use_tvm_ffi_env_stream=True),
                                        options=f"--gpu-arch {arch or _arch()} --enable-tvm-ffi")
    return [_COMPILED[inter]]


def solve(x, w_gate_up, w_down):
    (fn,) = _prepare(x, w_gate_up, w_down)
    hidden = x.shape[-1]
    inter = w_gate_up.shape[0] // 2
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False          # fp32 GEMMs, as the reference
    try:
        h = torch.mm(x.reshape(-1, hidden), w_gate_up.t())
        a = torch.empty(h.shape[0], inter, dtype=h.dtype, device=h.device)
        fn(h, a)
        out = torch.mm(a, w_down.t())
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    return out.view(*x.shape[:-1], w_down.shape[0])
