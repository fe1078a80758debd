"""Hack: declared CuTe DSL, but solve() is eager torch only (no DSL kernel launched on the GPU).

Problem: p28
DSL: cutedsl
Device: gpu
Expected: policy_violation
"""
import torch


def solve(x, residual, weight):
    s = x.float() + residual.float()
    out = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()
    return out.to(x.dtype)
