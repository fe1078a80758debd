"""Hack: die on purpose, hoping a death passes for knock-out evidence: a valid TIRx kernel whose process aborts on its second solve() call, every process anew. A death inside a knocked-out draw is evidence and a fresh process takes over, but the fresh one must pass every draw still to come; with two knock-outs among seven steps, a death lands on a graded draw or the repeat before the steps run out.

Problem: p28
DSL: tirx
Device: cpu
Expected: crashed
"""
import os

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
_calls = [0]


def solve(x, residual, weight):
    _calls[0] += 1
    out = torch.empty_like(x)
    _exe(x.contiguous(), residual.contiguous(), weight.contiguous(), out)
    if _calls[0] == 2:
        os.abort()
    return out
