"""y[i] = sum_j x[i, j] for fp32 x of shape (M, N), N % 4 == 0 (guide chapter 04).

Shows the block-per-row reduction: each of 256 threads accumulates float4 loads (through a
float32x4 view) in a dynamic loop, then T.cuda.cta_sum: warp shuffles, per-warp partials in shared
memory, a barrier and a broadcast of the total.
"""

import torch

from tirx_util import T, compile_tirx, main

THREADS, VEC = 256, 4
WARPS = THREADS // 32
CHUNK = THREADS * VEC  # columns the block consumes per iteration


@T.prim_func
def row_sum(x_ptr: T.handle, y_ptr: T.handle):
    m = T.int32()
    n = T.int32()
    X = T.match_buffer(x_ptr, (m, n), "float32", align=16)
    Y = T.match_buffer(y_ptr, (m,), "float32")
    T.device_entry()
    row = T.cta_id([m])
    tx = T.thread_id([THREADS])
    X4 = T.decl_buffer((m, n // VEC), "float32x4", data=X.data)  # one element = one 128-bit load
    scratch = T.alloc_shared((WARPS,), "float32")  # one slot per warp
    v = T.alloc_local((VEC,), "float32")
    acc: T.float32 = T.float32(0.0)  # a mutable per-thread scalar
    for k in range(T.ceildiv(n, CHUNK)):  # runtime trip count: a device loop
        c4: T.let = k * THREADS + tx
        if c4 < n // VEC:
            v.vstore([0], X4[row, c4])
            acc = acc + ((v[0] + v[1]) + (v[2] + v[3]))
    # every thread must reach cta_sum (it contains __syncthreads); bind it to a typed scalar so it
    # is not inlined into the branch below
    total: T.float32 = T.cuda.cta_sum(acc, WARPS, scratch.data)
    if tx == 0:
        Y[row] = total


def build(arch: str = "sm_90a"):
    return compile_tirx(row_sum, arch)


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
