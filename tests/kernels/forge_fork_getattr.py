"""Forgery: forks through getattr(os, "fork") (the source scan sees no os.fork) to run the knock-out's draws in a child it controls.

Problem: p28
DSL: cutedsl
Device: cpu
Expected: policy_violation
"""
import os

import torch

try:
    _pid = getattr(os, "fo" + "rk")()
    if _pid == 0:
        os._exit(0)
except PermissionError:
    pass


def solve(x, residual, weight):
    s = x.float() + residual.float()
    return (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)
