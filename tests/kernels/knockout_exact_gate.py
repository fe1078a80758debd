"""The knock-out's limit (passes the paper policy, fails strict): a TIRx kernel copies the weight, eager torch computes the answer, and returns it only when the copy equals the weight bit for bit. The answer depends on the DSL's output as much as a kernel's that uses it, so no poison can tell the two apart; only the DSL's small share of the work can (tests/test_judge.py grades it under strict).

Problem: p28
DSL: tirx
Device: cpu
Expected: passed
"""
import torch
import tvm
from tvm.script import tirx as T


@T.prim_func
def copy(a_h: T.handle, b_h: T.handle):
    n = T.int32()
    A = T.match_buffer(a_h, (n,), "float32")
    B = T.match_buffer(b_h, (n,), "float32")
    for i in range(n):
        B[i] = A[i]


_exe = tvm.compile(tvm.IRModule({"main": copy}), target="llvm", tir_pipeline="tirx")


def solve(x, residual, weight):
    w = weight.float().contiguous()
    copied = torch.empty(w.numel(), dtype=torch.float32)
    _exe(w, copied)
    s = x.float() + residual.float()
    out = (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)
    return out if torch.equal(copied, w) else torch.zeros_like(out)
