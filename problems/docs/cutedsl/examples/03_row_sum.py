"""y[i] = sum_j x[i, j] for fp32 x of shape (M, N), N % 4 == 0 (guide chapter 04).

Shows the block-per-row reduction: each of 256 threads accumulates float4 loads in a dynamic loop,
then a warp shuffle reduction, per-warp partials in shared memory, a barrier, and a final warp.
"""

import torch

import cutlass
import cutlass.cute as cute
from cutlass.memory import SmemAllocator
from cute_util import env_stream, fake_matrix, fake_vector, main, options

THREADS, VEC = 256, 4
WARPS = THREADS // 32


@cute.kernel
def row_sum_kernel(mX: cute.Tensor, mY: cute.Tensor, tv_layout: cute.Layout):
    tidx, _, _ = cute.arch.thread_idx()
    row, _, _ = cute.arch.block_idx()
    n = mX.shape[1]
    chunk = THREADS * VEC  # columns the block consumes per iteration
    gRow = cute.zipped_divide(mX[row, None], (chunk,))  # ((chunk), n_chunks)

    acc = cutlass.Float32(0.0)
    for k in range(cute.size(gRow, mode=[1])):  # a Python range over a runtime value: a device loop
        if k * chunk + tidx * VEC < n:
            vec = cute.composition(gRow[None, k], tv_layout)[tidx, None].load()  # this thread's 4 floats
            acc = acc + vec.reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), 0)

    acc = cute.arch.warp_reduction_sum(acc)  # butterfly shuffles inside each warp

    partial = SmemAllocator().allocate_tensor(cutlass.Float32, cute.make_layout(WARPS), byte_alignment=16)
    warp, lane = cute.arch.warp_idx(), cute.arch.lane_idx()
    if lane == 0:
        partial[warp] = acc
    cute.arch.barrier()  # every thread of the block must reach it
    if warp == 0:
        total = cutlass.Float32(0.0)
        if lane < WARPS:
            total = partial[lane]
        total = cute.arch.warp_reduction_sum(total)
        if lane == 0:
            mY[row] = total


@cute.jit
def row_sum(mX: cute.Tensor, mY: cute.Tensor, stream):
    tv_layout = cute.make_layout((THREADS, VEC), stride=(VEC, 1))  # thread t owns columns [4t, 4t+4)
    row_sum_kernel(mX, mY, tv_layout).launch(grid=[mX.shape[0], 1, 1], block=[THREADS, 1, 1], stream=stream)


def build(arch: str = "sm_90a", keep_dir: str | None = None):
    m, n = cute.sym_int(), cute.sym_int(divisibility=VEC)
    return cute.compile(row_sum, fake_matrix(cutlass.Float32, m, n), fake_vector(cutlass.Float32, m, align=4),
                        env_stream(), options=options(arch, keep_dir))


def check(fn):
    for m, n in ((3, 4), (37, 1028), (5, 20000), (4096, 4096)):
        x = torch.randn(m, n, device="cuda")
        y = torch.empty(m, device="cuda")
        fn(x, y)
        torch.cuda.synchronize()
        torch.testing.assert_close(y, x.sum(dim=1), rtol=1e-4, atol=1e-3)
    return lambda: fn(x, y)


if __name__ == "__main__":
    raise SystemExit(main(build, check))
