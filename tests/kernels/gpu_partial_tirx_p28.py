"""Partial DSL: a real TIRx CUDA kernel does a trivial but load-bearing part (it converts the 4096-element weight to fp32, and the answer uses it); eager torch does the add and the norm. Passes the paper policy with its small DSL share recorded; fails strict.

Problem: p28
DSL: tirx
Device: gpu
Expected: passed
"""
import torch
import tvm
from tvm.script import tirx as Tx

THREADS = 128
_compiled = {}


def _make(n: int):
    @Tx.prim_func
    def widen(w: Tx.handle, o: Tx.handle):
        W = Tx.match_buffer(w, (n,), "bfloat16")
        O = Tx.match_buffer(o, (n,), "float32")
        Tx.device_entry()
        block = Tx.cta_id([(n + THREADS - 1) // THREADS])
        tx = Tx.thread_id([THREADS])
        i = Tx.meta_var(block * THREADS + tx)
        if i < n:
            O[i] = Tx.Cast("float32", W[i])

    return widen


def _kernel(n: int, device: torch.device):
    if n not in _compiled:
        major, minor = torch.cuda.get_device_capability(device)
        target = tvm.target.Target({"kind": "cuda", "arch": f"sm_{major}{minor}" + ("a" if major >= 9 else "")})
        with target:
            _compiled[n] = tvm.compile(tvm.IRModule({"main": _make(n)}), target=target, tir_pipeline="tirx")
    return _compiled[n]


def solve(x, residual, weight):
    w = torch.empty(weight.numel(), dtype=torch.float32, device=weight.device)
    _kernel(weight.numel(), weight.device)(weight.contiguous(), w)
    s = x.float() + residual.float()
    return (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * w).to(x.dtype)
