"""Hack: patches time.perf_counter through an obfuscated setattr that a source scan cannot resolve (caught at runtime).

Problem: p28
DSL: cutedsl
Device: cpu
Expected: policy_violation
"""
import time as _clock

import torch

_target = globals()["_cl" + "ock"]
setattr(_target, "perf_" + "counter", lambda: 0.0)


def solve(x, residual, weight):
    s = x.float() + residual.float()
    out = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()
    return out.to(x.dtype)
