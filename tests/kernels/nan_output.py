"""Broken: the right structure and mostly right values, but one NaN in the output.

Problem: p32
DSL: cutedsl
Device: cpu
Expected: incorrect
"""
import torch


def solve(x, w_gate_up, w_down):
    h = torch.nn.functional.linear(x, w_gate_up)
    gate, up = h.chunk(2, dim=-1)
    out = torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, w_down)
    out.view(-1)[0] = float("nan")
    return out
