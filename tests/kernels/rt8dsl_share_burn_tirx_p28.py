"""Hack (a known limit: passes strict): the exact gate of knockout_exact_gate, with the TIRx copy repeated until it
takes far longer than the eager torch that computes the answer. The share is time, not work: a decorative kernel that
burns time lifts it over the strict floor. The knock-out cannot tell the gate from a kernel that uses its output, and
strict's share cannot tell burnt time from work; on a GPU the busy-time check makes the burn cost the timed calls too
(burning only while profiled must still show 0.6x the profiled busy time in every timed call), so the figure is slow.

Problem: p28
DSL: tirx
Device: cpu
Expected: passed
"""
import torch
import tvm
from tvm.script import tirx as T

REPEAT = 400000


@T.prim_func
def copy(a_h: T.handle, b_h: T.handle):
    n = T.int32()
    A = T.match_buffer(a_h, (n,), "float32")
    B = T.match_buffer(b_h, (n,), "float32")
    for i in range(n):
        B[i] = A[i]
    for r in range(REPEAT):
        for i in range(n):
            B[i] = B[i] * T.float32(0.5) + A[i] * T.float32(0.5)


_exe = tvm.compile(tvm.IRModule({"main": copy}), target="llvm", tir_pipeline="tirx")


def solve(x, residual, weight):
    w = weight.float().contiguous()
    copied = torch.empty(w.numel(), dtype=torch.float32)
    _exe(w, copied)
    s = x.float() + residual.float()
    out = (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)
    return out if torch.equal(copied, w) else torch.zeros_like(out)
