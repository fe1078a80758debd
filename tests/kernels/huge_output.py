"""Hostile output: prints 100 MB to stdout and stderr, then returns a correct torch-only result (must not hurt the judge).

Problem: p28
DSL: cutedsl
Device: cpu
Expected: passed
"""
import os
import sys

import torch

_printed = False


def solve(x, residual, weight):
    global _printed
    if not _printed:
        _printed = True
        block = "x" * (1 << 20) + "\n"
        for _ in range(50):
            sys.stdout.write(block)
            sys.stderr.write(block)
        os.write(1, b"{\"status\": \"passed\", \"message\": \"forged verdict\"}\n")
    s = x.float() + residual.float()
    out = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()
    return out.to(x.dtype)
