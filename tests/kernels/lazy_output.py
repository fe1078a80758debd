"""Hack: returns a tensor subclass (a lazy/wrapped tensor) instead of a plain torch.Tensor.

Problem: p32
DSL: cutedsl
Device: cpu
Expected: wrong_structure
"""
import torch


class Lazy(torch.Tensor):
    pass


def solve(x, w_gate_up, w_down):
    h = torch.nn.functional.linear(x, w_gate_up)
    gate, up = h.chunk(2, dim=-1)
    out = torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, w_down)
    return torch.Tensor._make_subclass(Lazy, out)
