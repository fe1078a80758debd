"""Valid: the block copy as a TIRx kernel compiled for the CPU (target llvm), writing dst_k/dst_v in place; the knock-out restores them first.

Problem: p25
DSL: tirx
Device: cpu
Expected: passed
"""
import tvm
from tvm.script import tirx as T


@T.prim_func
def copy_blocks(s_h: T.handle, d_h: T.handle, m_h: T.handle):
    blocks = T.int32()
    width = T.int32()
    pairs = T.int32()
    S = T.match_buffer(s_h, (blocks, width), "uint8")
    D = T.match_buffer(d_h, (blocks, width), "uint8")
    M = T.match_buffer(m_h, (pairs, 2), "int64")
    for p in range(pairs):
        for j in range(width):
            D[M[p, 1], j] = S[M[p, 0], j]


_exe = tvm.compile(tvm.IRModule({"main": copy_blocks}), target="llvm", tir_pipeline="tirx")


def solve(src_k, src_v, dst_k, dst_v, block_mapping):
    for src, dst in ((src_k, dst_k), (src_v, dst_v)):
        _exe(src.view(src.shape[0], -1), dst.view(dst.shape[0], -1), block_mapping.contiguous())
