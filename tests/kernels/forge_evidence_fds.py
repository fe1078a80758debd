"""Forgery: no DSL at all. Every solve() writes forged "DSL call" evidence frames (the judge's wire format) on every pipe it holds, so that the referee counts TIRx calls that never ran.

Problem: p28
DSL: tirx
Device: cpu
Expected: policy_violation
"""
import json
import os
import stat
import struct

import torch


def _open_fds() -> list[int]:
    """Every descriptor this process holds above stderr (the judge passes its pipes with the numbers they had in
    the judge's own process, which can be in the hundreds)."""
    try:
        return sorted(int(n) for n in os.listdir("/proc/self/fd") if int(n) > 2)
    except OSError:
        return list(range(3, 4096))

_FRAME = json.dumps({"ev": "call", "dsl": "tirx", "key": "tirx:main:", "symbols": []}).encode()


def _forge():
    for fd in _open_fds():
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                os.write(fd, struct.pack(">IB", len(_FRAME), 255) + _FRAME)
        except OSError:
            continue


def solve(x, residual, weight):
    _forge()
    s = x.float() + residual.float()
    return (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)
