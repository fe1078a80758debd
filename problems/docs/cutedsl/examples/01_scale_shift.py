"""y = alpha * x + beta on a 1-D fp32 tensor: the smallest complete kernel (guide chapters 01-02).

Shows: @cute.kernel + @cute.jit, thread/block indices, a bounds check, runtime scalar arguments,
a dynamic length, compiling from fake tensors for an explicit arch, and launching on torch's stream.
"""

import torch

import cutlass
import cutlass.cute as cute
from cute_util import env_stream, fake_vector, main, options

THREADS = 256


@cute.kernel
def scale_shift_kernel(x: cute.Tensor, y: cute.Tensor, alpha: cutlass.Float32, beta: cutlass.Float32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * THREADS + tidx
    if i < x.shape[0]:  # the last block is partly out of range
        y[i] = alpha * x[i] + beta


@cute.jit
def scale_shift(x: cute.Tensor, y: cute.Tensor, alpha: cutlass.Float32, beta: cutlass.Float32, stream):
    n_blocks = (x.shape[0] + THREADS - 1) // THREADS
    scale_shift_kernel(x, y, alpha, beta).launch(grid=(n_blocks, 1, 1), block=(THREADS, 1, 1), stream=stream)


def build(arch: str = "sm_90a", keep_dir: str | None = None):
    n = cute.sym_int()  # dynamic length: one compiled kernel serves every n
    x = fake_vector(cutlass.Float32, n)
    y = fake_vector(cutlass.Float32, n)
    return cute.compile(scale_shift, x, y, cutlass.Float32(1.0), cutlass.Float32(0.0), env_stream(),
                        options=options(arch, keep_dir))


def check(fn):
    for n in (1, 1000, 1 << 20):
        x = torch.randn(n, device="cuda")
        y = torch.empty_like(x)
        fn(x, y, 2.5, -1.0)  # the stream argument is omitted: torch's current stream is used
        torch.cuda.synchronize()
        torch.testing.assert_close(y, 2.5 * x - 1.0)
    return lambda: fn(x, y, 2.5, -1.0)


if __name__ == "__main__":
    raise SystemExit(main(build, check))
