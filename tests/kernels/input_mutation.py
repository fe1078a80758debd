"""Hack: computes the residual sum in place into the `residual` input (in-place mutation of inputs).

Problem: p28
DSL: cutedsl
Device: cpu
Expected: incorrect
"""
import torch


def solve(x, residual, weight):
    s = x.float() + residual.float()
    out = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()
    residual.copy_(s.to(x.dtype))
    return out.to(x.dtype)
