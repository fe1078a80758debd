"""y = relu(x) + b for bf16 x, y of shape (M, N) and a bias b of shape (N,) (guide chapters 03-04, 07).

Shows: a 2-D grid over (row, column chunk), thread-scope tile copies of 8 bf16 (128-bit vector
loads and stores) between global memory and registers, the bias indexed by column only (a broadcast),
and bf16 in/out with fp32 math. Requires N % 8 == 0 (a vector of 8 bf16 never straddles the edge).
"""

import torch

from tirx_util import T, compile_tirx, main

THREADS, VEC = 128, 8
CHUNK = THREADS * VEC  # columns per block


@T.prim_func
def relu_bias(x_ptr: T.handle, b_ptr: T.handle, y_ptr: T.handle):
    m = T.int32()
    n = T.int32()
    X = T.match_buffer(x_ptr, (m, n), "bfloat16", align=16)  # align=16: 128-bit accesses are legal
    B = T.match_buffer(b_ptr, (n,), "bfloat16", align=16)
    Y = T.match_buffer(y_ptr, (m, n), "bfloat16", align=16)
    T.device_entry()
    cb, row = T.cta_id([T.ceildiv(n, CHUNK), m])  # blockIdx.x, blockIdx.y
    tx = T.thread_id([THREADS])
    # (m, n/8, 8) views: their offsets are visibly multiples of 8 elements (16 B), so the copies below
    # become 128-bit accesses; indexing X[row, col:col + 8] directly gives 8 scalar loads (row * n
    # has unknown alignment)
    X3 = T.decl_buffer((m, n // VEC, VEC), "bfloat16", data=X.data)
    Y3 = T.decl_buffer((m, n // VEC, VEC), "bfloat16", data=Y.data)
    xr = T.alloc_local((VEC,), "bfloat16")  # registers
    br = T.alloc_local((VEC,), "bfloat16")
    yr = T.alloc_local((VEC,), "bfloat16")
    col = T.meta_var(cb * CHUNK + tx * VEC)  # meta_var: inlined where used, no variable
    if col < n:
        T.tile.copy(xr[:], X3[row, col // VEC, 0:VEC])  # one 128-bit load
        T.tile.copy(br[:], B[col:col + VEC])
        for v in T.unroll(VEC):
            f = T.meta_var(T.max(T.Cast("float32", xr[v]), T.float32(0)) + T.Cast("float32", br[v]))
            yr[v] = T.Cast("bfloat16", f)
        T.tile.copy(Y3[row, col // VEC, 0:VEC], yr[:])  # one 128-bit store


def build(arch: str = "sm_90a"):
    return compile_tirx(relu_bias, arch)


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
