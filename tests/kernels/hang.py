"""Hang: solve() never returns (busy loop); the judge must kill it at the time limit.

Problem: p28
DSL: cutedsl
Device: cpu
Expected: timeout
Timeout: 1.0
"""


def solve(x, residual, weight):
    while True:
        pass
