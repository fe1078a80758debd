"""Hostile: leaves processes behind: forks (os.fork reached through getattr), the child calls setsid and forks again, and the grandchild execs a long sleep that outlives the grading; then it answers correctly.

In the sandbox every process of the grading dies with its PID namespace: nothing named
mkb-attack-survivor runs after the grading.

Problem: p28
DSL: cutedsl
Device: cpu
Expected: passed
Also: policy_violation
"""
import os

import torch

_fork, _exec = getattr(os, "fo" + "rk"), getattr(os, "ex" + "ecv")


def _leave_a_survivor() -> None:
    if _fork() == 0:
        os.setsid()
        if _fork() == 0:
            try:
                _exec("/bin/sh", ["/bin/sh", "-c", "sleep 300 # mkb-attack-survivor"])
            finally:
                os._exit(0)
        os._exit(0)


def solve(x, residual, weight):
    _leave_a_survivor()
    s = x.float() + residual.float()
    out = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()
    return out.to(x.dtype)
