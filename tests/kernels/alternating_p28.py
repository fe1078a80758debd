"""Broken: right on every other call only (odd calls correct, even calls off by 1), so 3 of the 5 correctness
draws are correct; the judge runs all five to say so, and the grading is incorrect.

Problem: p28
DSL: cutedsl
Device: cpu
Expected: incorrect
"""
import torch

_calls = [0]


def solve(x, residual, weight):
    _calls[0] += 1
    s = x.float() + residual.float()
    out = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()
    return (out + (0.0 if _calls[0] % 2 else 1.0)).to(x.dtype)
