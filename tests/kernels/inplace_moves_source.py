"""Hack: updates dst_k/dst_v correctly but also clears the source blocks (a move, not a copy): src_k/src_v are not MUTATES inputs.

Problem: p25
DSL: cutedsl
Device: cpu
Expected: incorrect
"""


def solve(src_k, src_v, dst_k, dst_v, block_mapping):
    src, dst = block_mapping[:, 0], block_mapping[:, 1]
    dst_k[dst] = src_k[src]
    dst_v[dst] = src_v[src]
    src_k[src] = 0
    src_v[src] = 0
