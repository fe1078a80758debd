"""Hang: solve() sleeps for an hour; the judge must kill it at the time limit (the tests that kill the judge or its referee mid-grading use it too).

Problem: p28
DSL: cutedsl
Device: cpu
Expected: timeout
Timeout: 1.0
"""
import time


def solve(x, residual, weight):
    time.sleep(3600)
    return x
