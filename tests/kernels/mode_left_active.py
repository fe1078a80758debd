"""Hack: solve() returns zeros and leaves a torch dispatch mode on the stack whose handler of the harness's copy into the referee's slot writes the answer there, work done after solve() returned (on a GPU, after the timed window: tests/kernels/gpu_deferred_mode.py). The harness refuses a result returned with a mode active.

Problem: p28
DSL: cutedsl
Device: cpu
Expected: policy_violation
"""
import torch
from torch.utils._python_dispatch import TorchDispatchMode, _pop_mode


def _answer(x, residual, weight):
    s = x.float() + residual.float()
    return (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)


class _Later(TorchDispatchMode):
    def __init__(self, inputs, out):
        super().__init__()
        self.inputs, self.out = inputs, out

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.copy_.default and args[1] is self.out:
            _pop_mode()
            return args[0].copy_(_answer(*self.inputs))
        return func(*args, **(kwargs or {}))


def solve(x, residual, weight):
    out = torch.zeros_like(x)
    _Later((x, residual, weight), out).__enter__()
    return out
