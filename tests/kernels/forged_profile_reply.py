"""Hack: the knock-out's gate (a TIRx copy of the weight must be exact, eager torch computes the answer: knockout_exact_gate) plus a reply of its own to the judge's profile command, written on the harness's reply pipe during the first profiled call, ahead of the harness's: it claims that all the profiled CPU time was the DSL's, so the strict policy's share (0.9) is met; the harness's real reply was then read as the next command's, which did not mind.
(Graded here under the paper policy, which records the share but does not require it: the forged frame is read, its tag
fails and the grading is a policy_violation. In one of two fresh-clone CI runs on 2026-12-07 it passed: the fixture then
looked for the harness's pipes among descriptors 3-63 only, and the judge passes its pipes with the numbers they have in
the judge's own process, past 63 once a long test run holds enough spare gradings' pipes. It now looks at every
descriptor it holds, as a kernel would. Reading a forged frame is also covered by tests/test_judge_redteam.py.)

Problem: p28
DSL: tirx
Device: cpu
Expected: policy_violation
"""
import fcntl
import json
import os
import stat
import struct

import torch
import tvm
from tvm.script import tirx as T


def _open_fds() -> list[int]:
    """Every descriptor this process holds above stderr (the judge passes its pipes with the numbers they had in
    the judge's own process, which can be in the hundreds)."""
    try:
        return sorted(int(n) for n in os.listdir("/proc/self/fd") if int(n) > 2)
    except OSError:
        return list(range(3, 4096))


@T.prim_func
def copy(a_h: T.handle, b_h: T.handle):
    n = T.int32()
    A = T.match_buffer(a_h, (n,), "float32")
    B = T.match_buffer(b_h, (n,), "float32")
    for i in range(n):
        B[i] = A[i]


_exe = tvm.compile(tvm.IRModule({"main": copy}), target="llvm", tir_pipeline="tirx")
_calls = [0]
CORRECTNESS_CALLS = 8
"""Five graded draws, two knock-outs and the repeat; the ninth call is the first profiled one."""
_FORGED = json.dumps({"ok": True, "cpu": True,
                      "calls": [{"dsl_us": 500.0, "total_us": 500.0, "span_us": 600.0}] * 3}).encode()


def _forge() -> None:
    for fd in _open_fds():
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode) and fcntl.fcntl(fd, fcntl.F_GETFL) & 3 == os.O_WRONLY:
                os.write(fd, struct.pack(">IB", len(_FORGED), 0) + _FORGED)
        except OSError:
            continue


def solve(x, residual, weight):
    _calls[0] += 1
    if _calls[0] == CORRECTNESS_CALLS + 1:
        _forge()
    w = weight.float().contiguous()
    copied = torch.empty(w.numel(), dtype=torch.float32)
    _exe(w, copied)
    s = x.float() + residual.float()
    out = (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)
    return out if torch.equal(copied, w) else torch.zeros_like(out)
