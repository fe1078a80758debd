"""q = fp8_e4m3(clamp(x * inv_scale, -448, 448)) for bf16 x of shape (M, N), N % 16 == 0 (guide chapter 07).

Shows: converting fp32 to fp8 (e4m3) with T.Cast, 16 contiguous elements per thread (two 128-bit
loads, one 128-bit store), a 2-D grid, and handing fp8 data across the torch boundary as uint8 (the
output is a torch.uint8 tensor, viewed in the kernel as float8_e4m3fn and on the host as
torch.float8_e4m3fn).
"""

import torch

from tirx_util import T, compile_tirx, main

THREADS, VEC = 128, 16
CHUNK = THREADS * VEC
E4M3_MAX = 448.0


@T.prim_func
def quantize(x_ptr: T.handle, q_ptr: T.handle, inv_scale: T.float32):
    m = T.int32()
    n = T.int32()
    X = T.match_buffer(x_ptr, (m, n), "bfloat16", align=16)
    Q = T.match_buffer(q_ptr, (m, n), "uint8", align=16)
    T.device_entry()
    cb, row = T.cta_id([T.ceildiv(n, CHUNK), m])
    tx = T.thread_id([THREADS])
    X3 = T.decl_buffer((m, n // VEC, VEC), "bfloat16", data=X.data)  # 16-element groups
    Q3 = T.decl_buffer((m, n // VEC, VEC), "float8_e4m3fn", data=Q.data)  # same bytes, as e4m3
    xr = T.alloc_local((VEC,), "bfloat16")
    qr = T.alloc_local((VEC,), "float8_e4m3fn")
    col = T.meta_var(cb * CHUNK + tx * VEC)
    if col < n:
        T.tile.copy(xr[:], X3[row, col // VEC, 0:VEC])  # 32 bytes: two 128-bit loads
        for v in T.unroll(VEC):
            f = T.meta_var(T.Cast("float32", xr[v]) * inv_scale)
            qr[v] = T.Cast("float8_e4m3fn", T.min(T.max(f, T.float32(-E4M3_MAX)), T.float32(E4M3_MAX)))
        T.tile.copy(Q3[row, col // VEC, 0:VEC], qr[:])  # 16 bytes: one 128-bit store


def build(arch: str = "sm_90a"):
    return compile_tirx(quantize, arch)


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
