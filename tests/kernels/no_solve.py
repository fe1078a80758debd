"""Broken: kernel.py defines no solve() function.

Problem: p28
DSL: tirx
Device: cpu
Expected: import_error
"""


def solver(x, residual, weight):
    return x
