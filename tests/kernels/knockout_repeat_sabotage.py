"""Knock-out bypass: a decorative TIRx call, and a wrong answer whenever solve() sees inputs it has seen before (a knock-out that re-runs a graded draw's inputs would look load-bearing).

Problem: p28
DSL: tirx
Device: cpu
Expected: incorrect
"""
import torch
import tvm
from tvm.script import tirx as T


@T.prim_func
def copy(a_h: T.handle, b_h: T.handle):
    n = T.int32()
    A = T.match_buffer(a_h, (n,), "float32")
    B = T.match_buffer(b_h, (n,), "float32")
    for i in range(n):
        B[i] = A[i]


_exe = tvm.compile(tvm.IRModule({"main": copy}), target="llvm", tir_pipeline="tirx")
_seen = set()


def solve(x, residual, weight):
    scratch = torch.empty(weight.numel(), dtype=torch.float32)
    _exe(weight.float().contiguous(), scratch)
    s = x.float() + residual.float()
    out = (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)
    key = (float(x.float().sum()), float(residual.float().sum()), float(weight.float().sum()))
    if key in _seen:
        return torch.zeros_like(out)
    _seen.add(key)
    return out
