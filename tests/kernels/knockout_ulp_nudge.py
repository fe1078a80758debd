"""Knock-out bypass: a decorative TIRx call (its result is thrown away) plus a 1-ulp nudge of the answer on every other call, so that two runs never give the same bits and a knock-out that looks only at bits sees a change.

Problem: p28
DSL: tirx
Device: cpu
Expected: policy_violation
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
_calls = [0]


def solve(x, residual, weight):
    scratch = torch.empty(weight.numel(), dtype=torch.float32)
    _exe(weight.float().contiguous(), scratch)
    s = x.float() + residual.float()
    out = (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)
    _calls[0] += 1
    if _calls[0] % 2:
        out = torch.nextafter(out, torch.full_like(out, float("inf")))
    return out
