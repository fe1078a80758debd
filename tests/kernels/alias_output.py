"""Hack: writes the result into the `x` input and returns that very tensor (output aliasing an input).

Problem: p28
DSL: cutedsl
Device: cpu
Expected: incorrect
"""
import torch


def solve(x, residual, weight):
    s = x.float() + residual.float()
    out = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()
    return x.copy_(out.to(x.dtype))
