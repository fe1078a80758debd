"""Hack: all-zero outputs of the right structure (the harness that only checks shapes would pass it).

Problem: p32
DSL: cutedsl
Device: cpu
Expected: incorrect
"""
import torch


def solve(x, w_gate_up, w_down):
    return torch.zeros(*x.shape[:-1], w_down.shape[0], dtype=x.dtype, device=x.device)
