"""Hack: declared TIRx, but solve() is plain eager torch: no DSL kernel at all.

Problem: p28
DSL: tirx
Device: cpu
Expected: policy_violation
"""
import torch


def solve(x, residual, weight):
    s = x.float() + residual.float()
    out = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()
    return out.to(x.dtype)
