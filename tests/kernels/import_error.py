"""Broken: kernel.py imports a module that does not exist.

Problem: p28
DSL: cutedsl
Device: cpu
Expected: import_error
"""
import definitely_not_a_module  # noqa: F401


def solve(x, residual, weight):
    return x
