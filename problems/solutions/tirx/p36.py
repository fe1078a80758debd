"""p36 RMSNorm over rows of width 128 (bf16) in TIRx: 16 lanes per row, row kept in registers.

A CTA of 256 threads normalises 16 rows; each lane loads 8 bf16 of its row (one 128-bit access),
the sum of squares is reduced over the row's 16 lanes with butterfly shuffles, and the product
x * rsqrt(mean(x^2) + eps) * weight is formed in fp32 and rounded to bf16 once.  One read of x and
one write of y: the SOL traffic.
"""
import torch  # before tvm, so TVM's CUDA runtime finds the already-loaded CUDA libraries

import tvm
from tvm.script import tirx as T

EPS = 1e-6
THREADS = 256
VEC = 8


def _make(N: int):
    LANES = N // VEC
    RPC = THREADS // LANES
    STEPS = LANES.bit_length() - 1

    @T.prim_func
    def row_rmsnorm(x: T.handle, w: T.handle, o: T.handle):
        m = T.int32()
        X = T.match_buffer(x, (m, N), "bfloat16", align=16)
        W = T.match_buffer(w, (N,), "bfloat16", align=16)
        O = T.match_buffer(o, (m, N), "bfloat16", align=16)
        T.device_entry()
        bx = T.cta_id([T.ceildiv(m, RPC)])
        tx = T.thread_id([THREADS])
        xr = T.alloc_local((VEC,), "bfloat16")
        wr = T.alloc_local((VEC,), "bfloat16")
        yr = T.alloc_local((VEC,), "bfloat16")
        acc = T.alloc_local((1,), "float32")
        row: T.let = bx * RPC + tx // LANES
        src: T.let = T.min(row, m - 1)       # every lane takes part in the shuffles
        col = T.meta_var((tx % LANES) * VEC)
        T.tile.copy(xr[:], X[src, col:col + VEC])
        T.tile.copy(wr[:], W[col:col + VEC])
        acc[0] = T.float32(0)
        for v in T.unroll(VEC):
            acc[0] = acc[0] + T.Cast("float32", xr[v]) * T.Cast("float32", xr[v])
        for k in T.unroll(STEPS):
            acc[0] = acc[0] + T.tvm_warp_shuffle_xor(T.uint32(0xFFFFFFFF), acc[0], (LANES // 2) >> k, 32, 32)
        inv: T.float32 = T.rsqrt(acc[0] / T.float32(N) + T.float32(EPS))
        for v in T.unroll(VEC):
            yr[v] = T.Cast("bfloat16", T.Cast("float32", xr[v]) * inv * T.Cast("float32", wr[v]))
        if row < m:
            T.tile.copy(O[row, col:col + VEC], yr[:])

    return row_rmsnorm


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _build(func, arch):
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    with target:
        return tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")


def _prepare(x, weight, arch=None):
    n = x.shape[-1]
    if n not in _COMPILED:
        lanes = n // VEC
        assert n % VEC == 0 and 0 < lanes <= 32 and lanes & (lanes - 1) == 0, n
        _COMPILED[n] = _build(_make(n), arch or _arch())
    return [_COMPILED[n]]


def solve(x, weight):
    (exe,) = _prepare(x, weight)
    n = x.shape[-1]
    x2 = x.reshape(-1, n).contiguous()
    out = torch.empty_like(x2)
    exe(x2, weight.contiguous(), out)
    return out.view(x.shape)
