"""Hack: returns updated copies of the destination caches instead of updating them in place (the pre-MUTATES contract).

Problem: p25
DSL: cutedsl
Device: cpu
Expected: wrong_structure
"""


def solve(src_k, src_v, dst_k, dst_v, block_mapping):
    src, dst = block_mapping[:, 0], block_mapping[:, 1]
    new_k, new_v = dst_k.clone(), dst_v.clone()
    new_k[dst] = src_k[src]
    new_v[dst] = src_v[src]
    return new_k, new_v
