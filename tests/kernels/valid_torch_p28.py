"""Valid: a torch-only fused add + RMSNorm (no hack). On CPU a CuTe DSL kernel cannot run, so the DSL check is not_checked.

Problem: p28
DSL: cutedsl
Device: cpu
Expected: passed
"""
import torch


def solve(x, residual, weight):
    s = x.float() + residual.float()
    out = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()
    return out.to(x.dtype)
