"""Hostile: keeps 3 GiB in files on /dev/shm and in $TMPDIR (RAM-backed, and not counted by RLIMIT_AS or in any process's RSS), past a 2 GiB memory limit, holds them a while, then answers correctly.

The grading's tmpfs mounts are capped at the memory limit, and the watchdog counts their files
with the candidate's resident memory: it kills the candidate.

Problem: p28
DSL: cutedsl
Device: cpu
Expected: crashed
Memory: 2048
"""
import os
import tempfile
import time

import torch

CHUNK, EACH = 64 << 20, 3 << 29


def _hoard(place: str) -> None:
    block, written = b"\1" * CHUNK, 0
    try:
        while written < EACH:
            with open(os.path.join(place, f"mkb-attack-hoard-{written // CHUNK}"), "wb") as fh:
                fh.write(block)
            written += CHUNK
    except OSError:  # the mount is full: keep what fits
        pass


def solve(x, residual, weight):
    for place in ("/dev/shm", tempfile.gettempdir()):
        _hoard(place)
    time.sleep(10)
    s = x.float() + residual.float()
    out = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()
    return out.to(x.dtype)
