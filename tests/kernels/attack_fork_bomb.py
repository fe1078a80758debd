"""Hostile: a fork bomb (os.fork reached through getattr): a thousand sleeping processes, to exhaust the host's pids while the grading runs.

The judge's watchdog kills the candidate's cell once its tree holds more than 64 processes, and the
PID namespace takes every one of them along. (Bounded at 1000, so a mistake costs nothing.)

Problem: p28
DSL: cutedsl
Device: cpu
Expected: crashed
Also: policy_violation
"""
import os
import time

_fork = getattr(os, "fo" + "rk")


def solve(x, residual, weight):
    for _ in range(1000):
        if _fork() == 0:
            time.sleep(600)
            os._exit(0)
    time.sleep(600)
    return x
