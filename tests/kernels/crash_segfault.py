"""Crash: solve() segfaults the candidate process (SIGSEGV), as a bad native kernel would.

Problem: p28
DSL: cutedsl
Device: cpu
Expected: crashed
"""
import sys


def _deeper(_=0):
    return list(map(_deeper, [0]))  # each level goes through C: the C stack overflows, a real SIGSEGV


def solve(x, residual, weight):
    sys.setrecursionlimit(1 << 30)
    _deeper()
