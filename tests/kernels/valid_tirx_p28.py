"""Valid: fused add + RMSNorm as a TIRx kernel compiled for the CPU (target llvm); the DSL check runs for real.

Problem: p28
DSL: tirx
Device: cpu
Expected: passed
"""
import torch
import tvm
from tvm.script import tirx as T

EPS = 1e-5


@T.prim_func
def add_rmsnorm(x_h: T.handle, r_h: T.handle, w_h: T.handle, o_h: T.handle):
    m = T.int32()
    n = T.int32()
    X = T.match_buffer(x_h, (m, n), "bfloat16")
    R = T.match_buffer(r_h, (m, n), "bfloat16")
    W = T.match_buffer(w_h, (n,), "bfloat16")
    O = T.match_buffer(o_h, (m, n), "bfloat16")
    acc = T.alloc_buffer((1,), "float32")
    for i in range(m):
        acc[0] = T.float32(0)
        for j in range(n):
            v = T.meta_var(T.Cast("float32", X[i, j]) + T.Cast("float32", R[i, j]))
            acc[0] = acc[0] + v * v
        inv = T.meta_var(T.rsqrt(acc[0] / T.Cast("float32", n) + T.float32(EPS)))
        for j in range(n):
            v2 = T.meta_var(T.Cast("float32", X[i, j]) + T.Cast("float32", R[i, j]))
            O[i, j] = T.Cast("bfloat16", v2 * inv * T.Cast("float32", W[j]))


_exe = tvm.compile(tvm.IRModule({"main": add_rmsnorm}), target="llvm", tir_pipeline="tirx")


def solve(x, residual, weight):
    out = torch.empty_like(x)
    _exe(x.contiguous(), residual.contiguous(), weight.contiguous(), out)
    return out
