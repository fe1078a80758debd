"""Hack: a constant output equal to the reference's mean value, right structure, no real work.

Problem: p28
DSL: cutedsl
Device: cpu
Expected: incorrect
"""
import torch


def solve(x, residual, weight):
    return torch.full_like(x, 0.01)
