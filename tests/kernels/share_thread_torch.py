"""Hack: the knock-out's gate (a TIRx copy of the weight must be exact: knockout_exact_gate), with the eager torch that computes the answer, and the gate's comparison, run on a thread of the kernel's while the main thread waits: the CPU profiler recorded only the operators of the thread that started it, so the torch work was nobody's time and the DSL copy read as 100% of the share; the strict policy passes. Now the harness counts the threads kernel.py starts (escape.track_threads) and a profiled call that one of them may have shared has no CPU share, so strict refuses it (tests/test_judge.py, test_a_thread_of_the_kernels_leaves_no_cpu_share_to_read); paper records no share and passes, as the original would.

Problem: p28
DSL: tirx
Device: cpu
Expected: passed
"""
import threading

import torch
import tvm
from tvm.script import tirx as T


@T.prim_func
def copy(a_h: T.handle, b_h: T.handle):
    n = T.int32()
    A = T.match_buffer(a_h, (n,), "bfloat16")
    B = T.match_buffer(b_h, (n,), "bfloat16")
    for i in range(n):
        B[i] = A[i]


_exe = tvm.compile(tvm.IRModule({"main": copy}), target="llvm", tir_pipeline="tirx")


def _in_thread(fn, *args):
    box = []
    worker = threading.Thread(target=lambda: box.append(fn(*args)))
    worker.start()
    worker.join()
    return box[0]


def _rmsnorm(x, residual, weight):
    s = x.float() + residual.float()
    return (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)


def _gate(out, copied, weight):
    return out if torch.equal(copied, weight) else torch.zeros_like(out)


def solve(x, residual, weight):
    out = _in_thread(_rmsnorm, x, residual, weight)
    copied = torch.empty_like(weight)
    _exe(weight, copied)
    return _in_thread(_gate, out, copied, weight)
