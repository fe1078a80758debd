"""y = relu(x) + b for bf16 x, y of shape (M, N) and a bias b of shape (N,) (guide chapters 03-04, 07).

Shows: tiling a 2-D tensor with zipped_divide, a thread-value layout, 128-bit vector copies through
a tiled copy, one predicate per vector for the ragged edge, a stride-0 broadcast view, and bf16 in/out
with fp32 math on TensorSSA values. Requires N % 8 == 0 (a vector of 8 bf16 never straddles the edge).
"""

import torch

import cutlass
import cutlass.cute as cute
from cute_util import env_stream, fake_matrix, fake_vector, main, options


@cute.kernel
def relu_bias_kernel(gX: cute.Tensor, gB: cute.Tensor, gY: cute.Tensor, gC: cute.Tensor, shape: cute.Shape,
                     thr_layout: cute.Layout, val_layout: cute.Layout):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    tile = ((None, None), bidx)  # this block's (TileM, TileN) tile
    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), gX.element_type, num_bits_per_copy=128)
    thr = cute.make_tiled_copy_tv(atom, thr_layout, val_layout).get_slice(tidx)
    tX, tB, tY = thr.partition_S(gX[tile]), thr.partition_S(gB[tile]), thr.partition_D(gY[tile])
    tC = thr.partition_S(gC[tile])  # the (m, n) coordinates of the same elements
    rX, rB, rY = cute.make_fragment_like(tX), cute.make_fragment_like(tB), cute.make_fragment_like(tY)

    # one Boolean per 128-bit vector: profile (vectors per atom, rest M, rest N)
    pred = cute.make_rmem_tensor(cute.make_layout((cute.size(tC, mode=[0, 1]), cute.size(tC, mode=[1]),
                                                   cute.size(tC, mode=[2]))), cutlass.Boolean)
    for v in cutlass.range_constexpr(cute.size(pred, mode=[0])):
        for m in cutlass.range_constexpr(cute.size(pred, mode=[1])):
            for n in cutlass.range_constexpr(cute.size(pred, mode=[2])):
                pred[v, m, n] = cute.elem_less(tC[(0, v), m, n], shape)

    cute.copy(atom, tX, rX, pred=pred)
    cute.copy(atom, tB, rB, pred=pred)
    x = rX.load().to(cutlass.Float32)  # TensorSSA: a register-resident vector value
    zero = cute.full_like(x, 0.0)
    y = cute.where(x > zero, x, zero) + rB.load().to(cutlass.Float32)
    rY.store(y.to(gY.element_type))
    cute.copy(atom, rY, tY, pred=pred)


@cute.jit
def relu_bias(mX: cute.Tensor, mB: cute.Tensor, mY: cute.Tensor, stream):
    vec = 128 // mX.element_type.width  # 8 bf16 per 128-bit access
    thr_layout = cute.make_ordered_layout((4, 32), order=(1, 0))  # 128 threads, 32 along N
    val_layout = cute.make_ordered_layout((4, vec), order=(1, 0))  # each: 4 rows x 8 contiguous
    tiler_mn, tv_layout = cute.make_layout_tv(thr_layout, val_layout)  # block tile (16, 256)
    mBb = cute.make_tensor(mB.iterator, cute.make_layout(mX.shape, stride=(0, 1)))  # bias as (M, N)
    gX = cute.zipped_divide(mX, tiler_mn)  # ((TileM, TileN), (RestM, RestN))
    gB = cute.zipped_divide(mBb, tiler_mn)
    gY = cute.zipped_divide(mY, tiler_mn)
    gC = cute.zipped_divide(cute.make_identity_tensor(mY.shape), tiler=tiler_mn)
    relu_bias_kernel(gX, gB, gY, gC, mY.shape, thr_layout, val_layout).launch(
        grid=[cute.size(gY, mode=[1]), 1, 1], block=[cute.size(tv_layout, mode=[0]), 1, 1], stream=stream)


def build(arch: str = "sm_90a", keep_dir: str | None = None):
    m, n = cute.sym_int(), cute.sym_int(divisibility=8)  # n % 8 == 0 is part of the compiled type
    bf16 = cutlass.BFloat16
    return cute.compile(relu_bias, fake_matrix(bf16, m, n), fake_vector(bf16, n), fake_matrix(bf16, m, n),
                        env_stream(), options=options(arch, keep_dir))


def check(fn):
    for m, n in ((1, 8), (37, 264), (4096, 4096)):
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        fn(x, b, y)
        torch.cuda.synchronize()
        torch.testing.assert_close(y, (torch.relu(x.float()) + b.float()).bfloat16())
    return lambda: fn(x, b, y)


if __name__ == "__main__":
    raise SystemExit(main(build, check))
