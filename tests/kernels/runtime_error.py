"""Broken: solve() raises (a shape bug in the candidate's own code).

Problem: p32
DSL: cutedsl
Device: cpu
Expected: runtime_error
"""
import torch


def solve(x, w_gate_up, w_down):
    return torch.nn.functional.linear(x, w_down)
