"""Honest: a producer TIRx kernel computes each row's scale and then raises a ready flag, and the consumer waits for the flag before it applies the scales, as a persistent kernel spins on a semaphore another kernel sets. A knocked-out draw poisons the flag (bitwise-not: -2), the wait never ends, and the knocked-out draw hangs; that hang is the draw's evidence, the hung process is ended, and a fresh candidate process runs the rest of the grading.

Problem: p28
DSL: tirx
Device: cpu
Expected: passed
Timeout: 180
"""
import torch
import tvm
from tvm.script import tirx as T

EPS = 1e-5


@T.prim_func
def produce(x_h: T.handle, r_h: T.handle, v_h: T.handle, f_h: T.handle):
    m = T.int32()
    n = T.int32()
    X = T.match_buffer(x_h, (m, n), "bfloat16")
    R = T.match_buffer(r_h, (m, n), "bfloat16")
    Inv = T.match_buffer(v_h, (m,), "float32")
    Flag = T.match_buffer(f_h, (1,), "int32")
    acc = T.alloc_buffer((1,), "float32")
    for i in range(m):
        acc[0] = T.float32(0)
        for j in range(n):
            v = T.meta_var(T.Cast("float32", X[i, j]) + T.Cast("float32", R[i, j]))
            acc[0] = acc[0] + v * v
        Inv[i] = T.rsqrt(acc[0] / T.Cast("float32", n) + T.float32(EPS))
    Flag[0] = 1


@T.prim_func
def consume(x_h: T.handle, r_h: T.handle, w_h: T.handle, v_h: T.handle, o_h: T.handle):
    m = T.int32()
    n = T.int32()
    X = T.match_buffer(x_h, (m, n), "bfloat16")
    R = T.match_buffer(r_h, (m, n), "bfloat16")
    W = T.match_buffer(w_h, (n,), "bfloat16")
    Inv = T.match_buffer(v_h, (m,), "float32")
    O = T.match_buffer(o_h, (m, n), "bfloat16")
    for i in range(m):
        for j in range(n):
            s = T.meta_var(T.Cast("float32", X[i, j]) + T.Cast("float32", R[i, j]))
            O[i, j] = T.Cast("bfloat16", s * Inv[i] * T.Cast("float32", W[j]))


_produce = tvm.compile(tvm.IRModule({"main": produce}), target="llvm", tir_pipeline="tirx")
_consume = tvm.compile(tvm.IRModule({"main": consume}), target="llvm", tir_pipeline="tirx")


def solve(x, residual, weight):
    x, residual = x.contiguous(), residual.contiguous()
    inv = torch.zeros(x.shape[0], dtype=torch.float32)
    flag = torch.zeros(1, dtype=torch.int32)
    _produce(x, residual, inv, flag)
    while int(flag[0]) != 1:  # the consumer's wait on the producer's flag
        pass
    out = torch.empty_like(x)
    _consume(x, residual, weight.contiguous(), inv, out)
    return out
