"""Valid: SwiGLU MLP with silu(gate) * up as a TIRx CUDA kernel; the two linears stay in eager torch (cuBLAS).

Problem: p32
DSL: tirx
Device: gpu
Expected: passed
"""
import torch
import tvm
from tvm.script import tirx as Tx

THREADS = 256
_compiled = []


@Tx.prim_func
def silu_mul(h: Tx.handle, a: Tx.handle):
    rows = Tx.int32()
    inter = Tx.int32()
    H = Tx.match_buffer(h, (rows, inter * 2), "float32")
    A = Tx.match_buffer(a, (rows, inter), "float32")
    Tx.device_entry()
    bx = Tx.cta_id([Tx.ceildiv(rows * inter, THREADS)])
    tx = Tx.thread_id([THREADS])
    i = Tx.meta_var(bx * THREADS + tx)
    if i < rows * inter:
        g = Tx.meta_var(H[i // inter, i % inter])
        A[i // inter, i % inter] = g / (Tx.float32(1) + Tx.exp(-g)) * H[i // inter, i % inter + inter]


def _kernel(device: torch.device):
    if not _compiled:
        major, minor = torch.cuda.get_device_capability(device)
        target = tvm.target.Target({"kind": "cuda", "arch": f"sm_{major}{minor}" + ("a" if major >= 9 else "")})
        with target:
            _compiled.append(tvm.compile(tvm.IRModule({"main": silu_mul}), target=target, tir_pipeline="tirx"))
    return _compiled[0]


def solve(x, w_gate_up, w_down):
    h = torch.nn.functional.linear(x, w_gate_up).reshape(-1, w_gate_up.shape[0])
    act = torch.empty(h.shape[0], h.shape[1] // 2, dtype=h.dtype, device=h.device)
    _kernel(x.device)(h, act)
    return torch.nn.functional.linear(act, w_down).reshape(*x.shape[:-1], w_down.shape[0])
