"""Valid: SwiGLU MLP with the silu(gate) * up step as a TIRx CPU kernel (llvm) and the two linears in eager torch.

Problem: p32
DSL: tirx
Device: cpu
Expected: passed
"""
import torch
import tvm
from tvm.script import tirx as T


@T.prim_func
def silu_mul(h_h: T.handle, a_h: T.handle):
    rows = T.int32()
    inter = T.int32()
    H = T.match_buffer(h_h, (rows, inter * 2), "float32")
    A = T.match_buffer(a_h, (rows, inter), "float32")
    for i in range(rows):
        for j in range(inter):
            g = T.meta_var(H[i, j])
            A[i, j] = g / (T.float32(1) + T.exp(-g)) * H[i, j + inter]


_exe = tvm.compile(tvm.IRModule({"main": silu_mul}), target="llvm", tir_pipeline="tirx")


def solve(x, w_gate_up, w_down):
    h = torch.nn.functional.linear(x, w_gate_up).reshape(-1, w_gate_up.shape[0])
    act = torch.empty(h.shape[0], h.shape[1] // 2, dtype=h.dtype, device=h.device)
    _exe(h.contiguous(), act)
    out = torch.nn.functional.linear(act, w_down)
    return out.reshape(*x.shape[:-1], w_down.shape[0])
