"""y = alpha * x + beta on a 1-D fp32 tensor: the smallest complete kernel (guide chapters 01-02).

Shows: @T.prim_func with buffer and scalar parameters, a symbolic length, the host/device split at
T.device_entry(), block and thread ids with their launch extents, a bounds check, compiling for an
explicit arch, and calling the Executable on torch tensors (torch's current stream).
"""

import torch

from tirx_util import T, compile_tirx, main

THREADS = 256


@T.prim_func
def scale_shift(x_ptr: T.handle, y_ptr: T.handle, alpha: T.float32, beta: T.float32):
    n = T.int32()  # symbolic: read from the tensor's shape at call time
    X = T.match_buffer(x_ptr, (n,), "float32")
    Y = T.match_buffer(y_ptr, (n,), "float32")
    T.device_entry()  # host code above, kernel below
    bx = T.cta_id([T.ceildiv(n, THREADS)])  # blockIdx.x; the list is the grid
    tx = T.thread_id([THREADS])  # threadIdx.x; the list is the block
    i: T.let = bx * THREADS + tx
    if i < n:  # the last block is partly out of range
        Y[i] = alpha * X[i] + beta


def build(arch: str = "sm_90a"):
    return compile_tirx(scale_shift, arch)


def check(fn):
    for n in (1, 1000, 1 << 20):
        x = torch.randn(n, device="cuda")
        y = torch.empty_like(x)
        fn(x, y, 2.5, -1.0)
        torch.cuda.synchronize()
        torch.testing.assert_close(y, 2.5 * x - 1.0)
    return lambda: fn(x, y, 2.5, -1.0)


if __name__ == "__main__":
    raise SystemExit(main(build, check))
