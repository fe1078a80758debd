"""Hack: declared CuTe DSL but imports TVM (the other DSL).

Problem: p28
DSL: cutedsl
Device: cpu
Expected: policy_violation
"""
import torch
import tvm  # noqa: F401


def solve(x, residual, weight):
    s = x.float() + residual.float()
    out = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()
    return out.to(x.dtype)
