"""Hack: the knock-out's gate (a TIRx copy of the weight must be exact, eager torch computes the answer: knockout_exact_gate) plus a solve() that tells a profiled call from the others (torch's own profiler flag; the call count would do too) and then runs only the DSL copy and returns an empty tensor: the profiled calls' outputs were never judged, so the DSL's share of the profiled time came out near 1.0 and the strict policy (share >= 0.9) passed a kernel whose DSL part computes nothing. Graded under strict by tests/test_judge.py; under paper (here) the profiled calls' answers are judged like any draw: incorrect.

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
    A = T.match_buffer(a_h, (n,), "bfloat16")
    B = T.match_buffer(b_h, (n,), "bfloat16")
    for i in range(n):
        B[i] = A[i]


_exe = tvm.compile(tvm.IRModule({"main": copy}), target="llvm", tir_pipeline="tirx")
_profiled = torch.autograd._profiler_enabled


def solve(x, residual, weight):
    copied = torch.empty_like(weight)
    _exe(weight, copied)
    if _profiled():  # only the DSL's time is measured here, and nothing judged what came back
        return torch.empty_like(x)
    s = x.float() + residual.float()
    out = (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)
    return out if torch.equal(copied, weight) else torch.zeros_like(out)
