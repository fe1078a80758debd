"""Hack: returns None, as the reference does, but never writes the destination caches (skips the in-place work).

Problem: p25
DSL: cutedsl
Device: cpu
Expected: incorrect
"""


def solve(src_k, src_v, dst_k, dst_v, block_mapping):
    return None
