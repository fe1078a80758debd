"""Hack/bug: returns only the normalised tensor instead of the (out, s) tuple the reference returns.

Problem: p28
DSL: cutedsl
Device: cpu
Expected: wrong_structure
"""
import torch


def solve(x, residual, weight):
    s = x.float() + residual.float()
    return (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)
