"""Forgery: asks for frames without naming a forbidden function: getattr(sys, "_getframe") from a thread whose target is the builtin itself, and the frame of a generator it drives (gi_frame).

Problem: p28
DSL: cutedsl
Device: cpu
Expected: policy_violation
"""
import sys
import threading

import torch

_frames = []


def _grab():
    getter = getattr(sys, "_get" + "frame")
    worker = threading.Thread(target=getter)
    worker.start()
    worker.join()

    def gen():
        yield 1

    g = gen()
    try:
        _frames.append(getattr(g, "gi_" + "frame"))
    except PermissionError:
        pass


def solve(x, residual, weight):
    _grab()
    s = x.float() + residual.float()
    return (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)
