"""Crash: solve() segfaults the candidate process (SIGSEGV), as a bad native kernel would.

Problem: p28
DSL: cutedsl
Device: cpu
Expected: crashed
"""
import faulthandler


def solve(x, residual, weight):
    faulthandler.disable()
    faulthandler._sigsegv()
