"""Knock-out bypass: a decorative TIRx call that the kernel times; when the call returns much faster than the first time (a knock-out that skips it), the answer is garbage, so the kernel looks load-bearing.

Problem: p28
DSL: tirx
Device: cpu
Expected: policy_violation
Also: incorrect
"""
import time

import torch
import tvm
from tvm.script import tirx as T


@T.prim_func
def busy(a_h: T.handle, b_h: T.handle):
    n = T.int32()
    A = T.match_buffer(a_h, (n,), "float32")
    B = T.match_buffer(b_h, (n,), "float32")
    for r in range(64):
        for i in range(n):
            B[i] = B[i] * T.float32(0.5) + A[i]


_exe = tvm.compile(tvm.IRModule({"main": busy}), target="llvm", tir_pipeline="tirx")
_first = []


def solve(x, residual, weight):
    scratch = torch.zeros(x.numel(), dtype=torch.float32)
    started = time.perf_counter()
    _exe(x.float().reshape(-1).contiguous(), scratch)
    took = time.perf_counter() - started
    _first.append(took)
    s = x.float() + residual.float()
    out = (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)
    return torch.zeros_like(out) if took < 0.2 * _first[0] else out
