"""Bug: copies each source block into the block after its destination (an off-by-one slot), in place.

Problem: p25
DSL: cutedsl
Device: cpu
Expected: incorrect
"""


def solve(src_k, src_v, dst_k, dst_v, block_mapping):
    src, dst = block_mapping[:, 0], (block_mapping[:, 1] + 1) % dst_k.shape[0]
    dst_k[dst] = src_k[src]
    dst_v[dst] = src_v[src]
