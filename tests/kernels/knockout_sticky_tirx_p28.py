"""Honest: knockout_death_tirx_p28's pipeline (the second TIRx kernel reads through row indices the first wrote), whose wild indices raise instead of aborting and leave the process unusable for every later call, as a sticky CUDA error leaves a CUDA context (torch raises "an illegal memory access was encountered" from then on). The failed knocked-out draw is evidence, and the grading goes on in a fresh candidate process.

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
def rows(x_h: T.handle, r_h: T.handle, i_h: T.handle, v_h: T.handle):
    m = T.int32()
    n = T.int32()
    X = T.match_buffer(x_h, (m, n), "bfloat16")
    R = T.match_buffer(r_h, (m, n), "bfloat16")
    Idx = T.match_buffer(i_h, (m,), "int32")
    Inv = T.match_buffer(v_h, (m,), "float32")
    acc = T.alloc_buffer((1,), "float32")
    for i in range(m):
        acc[0] = T.float32(0)
        for j in range(n):
            v = T.meta_var(T.Cast("float32", X[i, j]) + T.Cast("float32", R[i, j]))
            acc[0] = acc[0] + v * v
        Inv[i] = T.rsqrt(acc[0] / T.Cast("float32", n) + T.float32(EPS))
        Idx[i] = i


@T.prim_func
def gather(x_h: T.handle, r_h: T.handle, w_h: T.handle, i_h: T.handle, v_h: T.handle, o_h: T.handle):
    m = T.int32()
    n = T.int32()
    X = T.match_buffer(x_h, (m, n), "bfloat16")
    R = T.match_buffer(r_h, (m, n), "bfloat16")
    W = T.match_buffer(w_h, (n,), "bfloat16")
    Idx = T.match_buffer(i_h, (m,), "int32")
    Inv = T.match_buffer(v_h, (m,), "float32")
    O = T.match_buffer(o_h, (m, n), "bfloat16")
    for i in range(m):
        for j in range(n):
            s = T.meta_var(T.Cast("float32", X[Idx[i], j]) + T.Cast("float32", R[Idx[i], j]))
            O[i, j] = T.Cast("bfloat16", s * Inv[Idx[i]] * T.Cast("float32", W[j]))


_broken = [False]
_rows = tvm.compile(tvm.IRModule({"main": rows}), target="llvm", tir_pipeline="tirx")
_gather = tvm.compile(tvm.IRModule({"main": gather}), target="llvm", tir_pipeline="tirx")


def solve(x, residual, weight):
    if _broken[0]:
        raise RuntimeError("an illegal memory access was encountered (a sticky error: this process is unusable)")
    m = x.shape[0]
    idx = torch.full((m,), -1, dtype=torch.int32)
    inv = torch.zeros(m, dtype=torch.float32)
    x, residual = x.contiguous(), residual.contiguous()
    _rows(x, residual, idx, inv)
    if int(idx.min()) < 0 or int(idx.max()) >= m:
        _broken[0] = True
        raise RuntimeError("an illegal memory access was encountered")
    out = torch.empty_like(x)
    _gather(x, residual, weight.contiguous(), idx, inv, out)
    return out
