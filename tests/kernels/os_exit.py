"""Crash: solve() ends the candidate process with os._exit (no exception, no output).

Problem: p28
DSL: cutedsl
Device: cpu
Expected: crashed
"""
import os


def solve(x, residual, weight):
    os._exit(3)
