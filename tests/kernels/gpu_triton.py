"""Hack: a Triton kernel does the work, imported through builtins so that a source scan does not see it (caught at runtime).

Problem: p32
DSL: cutedsl
Device: gpu
Expected: policy_violation
"""
import builtins

import torch

_load = builtins.__dict__["__imp" + "ort__"]
triton = _load("triton")
tl = _load("triton.language", fromlist=["constexpr"])


@triton.jit
def _silu_mul(h, a, inter, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    row = i // inter
    col = i % inter
    g = tl.load(h + row * 2 * inter + col, mask=i < n)
    u = tl.load(h + row * 2 * inter + inter + col, mask=i < n)
    tl.store(a + i, g * tl.sigmoid(g) * u, mask=i < n)


def solve(x, w_gate_up, w_down):
    h = torch.nn.functional.linear(x, w_gate_up)
    inter = h.shape[-1] // 2
    act = torch.empty(*h.shape[:-1], inter, device=h.device)
    _silu_mul[(triton.cdiv(act.numel(), 1024),)](h, act, inter, act.numel(), BLOCK=1024)
    return torch.nn.functional.linear(act, w_down)
