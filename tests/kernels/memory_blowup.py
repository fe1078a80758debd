"""Hostile: allocates far more host memory than the judge allows (64 GiB); the limit must stop it, not the machine.

Problem: p28
DSL: cutedsl
Device: cpu
Expected: runtime_error
"""
import torch


def solve(x, residual, weight):
    hog = torch.ones(64 << 30, dtype=torch.uint8)
    return hog
