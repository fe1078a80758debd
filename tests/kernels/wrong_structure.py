"""Hack/bug: returns an (out, s) tuple where the reference returns the normalised tensor alone.

Problem: p28
DSL: cutedsl
Device: cpu
Expected: wrong_structure
"""
import torch


def solve(x, residual, weight):
    s = x.float() + residual.float()
    out = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()
    return out.to(x.dtype), s.to(x.dtype)
