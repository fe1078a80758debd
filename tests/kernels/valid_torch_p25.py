"""Valid: a torch-only block copy that updates dst_k and dst_v in place (MUTATES) and returns None.

Problem: p25
DSL: cutedsl
Device: cpu
Expected: passed
"""


def solve(src_k, src_v, dst_k, dst_v, block_mapping):
    src, dst = block_mapping[:, 0], block_mapping[:, 1]
    dst_k.index_copy_(0, dst, src_k.index_select(0, src))
    dst_v.index_copy_(0, dst, src_v.index_select(0, src))
