"""q = fp8_e4m3(clamp(x * inv_scale, -448, 448)) for bf16 x of shape (M, N), N % 16 == 0 (guide chapter 07).

Shows: converting fp32 vectors to fp8 (e4m3) with saturation, 16 contiguous elements per thread
(two 128-bit loads, one 128-bit store), a 2-D grid, and handing fp8 data across the torch boundary
as uint8 (the output is a torch.uint8 tensor; view it as torch.float8_e4m3fn on the host).
"""

import torch

import cutlass
import cutlass.cute as cute
from cute_util import env_stream, fake_matrix, main, options

THREADS, VEC = 128, 16
CHUNK = THREADS * VEC
E4M3_MAX = 448.0


@cute.kernel
def quantize_kernel(mX: cute.Tensor, mQ: cute.Tensor, inv_scale: cutlass.Float32, tv: cute.Layout):
    tidx, _, _ = cute.arch.thread_idx()
    cb, row, _ = cute.arch.block_idx()
    if cb * CHUNK + tidx * VEC < mX.shape[1]:  # whole 16-vectors only (N % 16 == 0)
        tX = cute.composition(cute.zipped_divide(mX[row, None], (CHUNK,))[None, cb], tv)[tidx, None]
        tQ = cute.composition(cute.zipped_divide(mQ[row, None], (CHUNK,))[None, cb], tv)[tidx, None]
        x = tX.load().to(cutlass.Float32) * inv_scale
        x = cute.where(x > E4M3_MAX, cute.full_like(x, E4M3_MAX), x)
        x = cute.where(x < -E4M3_MAX, cute.full_like(x, -E4M3_MAX), x)
        tQ.store(x.to(cutlass.Float8E4M3FN))  # round to nearest even


@cute.jit
def quantize(mX: cute.Tensor, mQ: cute.Tensor, inv_scale: cutlass.Float32, stream):
    mQ8 = cute.recast_tensor(mQ, cutlass.Float8E4M3FN)  # the uint8 buffer seen as e4m3
    tv = cute.make_layout((THREADS, VEC), stride=(VEC, 1))
    grid = ((mX.shape[1] + CHUNK - 1) // CHUNK, mX.shape[0], 1)
    quantize_kernel(mX, mQ8, inv_scale, tv).launch(grid=grid, block=(THREADS, 1, 1), stream=stream)


def build(arch: str = "sm_90a", keep_dir: str | None = None):
    m, n = cute.sym_int(), cute.sym_int(divisibility=VEC)
    return cute.compile(quantize, fake_matrix(cutlass.BFloat16, m, n), fake_matrix(cutlass.Uint8, m, n),
                        cutlass.Float32(1.0), env_stream(), options=options(arch, keep_dir))


def reference(x: torch.Tensor, inv_scale: float) -> torch.Tensor:
    return (x.float() * inv_scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def check(fn):
    for m, n in ((1, 16), (33, 4112), (4096, 4096)):
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16) * 100
        q = torch.empty(m, n, device="cuda", dtype=torch.uint8)
        fn(x, q, 2.0)  # values beyond +-448 saturate
        torch.cuda.synchronize()
        got = q.view(torch.float8_e4m3fn).float()
        torch.testing.assert_close(got, reference(x, 2.0).float(), rtol=0.125, atol=2 ** -9)
    return lambda: fn(x, q, 2.0)


if __name__ == "__main__":
    raise SystemExit(main(build, check))
