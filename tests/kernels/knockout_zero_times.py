"""Knock-out bypass: a real TIRx kernel copies the weight into a scratch buffer, eager torch computes the answer, and the answer "depends" on the kernel through `+ 0 * scratch.sum()` (a NaN poison propagates; finite values vanish).

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


def solve(x, residual, weight):
    scratch = torch.empty(weight.numel(), dtype=torch.float32)
    _exe(weight.float().contiguous(), scratch)
    s = x.float() + residual.float()
    out = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()
    return (out + 0 * scratch.sum()).to(x.dtype)
