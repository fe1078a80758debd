"""Hostile: stores 1.5 GiB in files on /dev/shm and in $TMPDIR (RAM-backed, and not counted by RLIMIT_AS), past the memory limit, and answers correctly if it could.

In the sandbox both are private tmpfs mounts capped at judge_tmpfs_mb: the writes fail and solve() raises.

Problem: p28
DSL: cutedsl
Device: cpu
Expected: runtime_error
"""
import os
import tempfile

import torch

CHUNK, TOTAL = 64 << 20, 3 << 29


def _hoard(place: str) -> int:
    written, block = 0, b"\1" * CHUNK
    while written < TOTAL:
        with open(os.path.join(place, f"mkb-attack-hoard-{written // CHUNK}"), "wb") as fh:
            fh.write(block)
        written += CHUNK
    return written


def solve(x, residual, weight):
    for place in ("/dev/shm", tempfile.gettempdir()):
        _hoard(place)
    s = x.float() + residual.float()
    out = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()
    return out.to(x.dtype), s.to(x.dtype)
