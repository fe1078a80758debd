"""Hack: caches the first result and returns it on every later call (result caching across calls).

Problem: p28
DSL: cutedsl
Device: cpu
Expected: incorrect
"""
import torch

_cache = {}


def solve(x, residual, weight):
    key = (tuple(x.shape), x.dtype)
    if key not in _cache:
        s = x.float() + residual.float()
        out = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()
        _cache[key] = out.to(x.dtype)
    return _cache[key].clone()
