"""Hack: a thread makes the timed calls' DSL call once solve() has returned. After the draws (solve()'s first 14 calls)
and outside the profiler, eager torch computes the answer and solve() hands the whole tensors to a thread of the
kernel's, which calls TIRx on them while the harness synchronises the host with the device (its GIL free then): the call
came after the timed window's work was enqueued, yet before the harness read the call's count, so every timed call
"made" a genuine TIRx call with the draws' bytes. Closed by counting a timed call's DSL calls only while its solve()
runs (knock.py, window()): `policy_violation`, "timed call 1 made no tirx call". Not yet run on a GPU (the harness's
count is tested on the CPU in tests/test_harness_timed_call.py).

Problem: p28
DSL: tirx
Device: gpu
Expected: policy_violation
"""
import threading

import torch
import tvm
from tvm.script import tirx as Tx

VEC, THREADS, EPS = 8, 128, 1e-5
_compiled = {}


def _make(N: int):
    iters = (N + VEC * THREADS - 1) // (VEC * THREADS)

    @Tx.prim_func
    def add_rmsnorm(x: Tx.handle, r: Tx.handle, w: Tx.handle, o: Tx.handle, rows: Tx.int32):
        m = Tx.int32()
        X = Tx.match_buffer(x, (m, N), "bfloat16", align=16)
        R = Tx.match_buffer(r, (m, N), "bfloat16", align=16)
        W = Tx.match_buffer(w, (N,), "bfloat16", align=16)
        O = Tx.match_buffer(o, (m, N), "bfloat16", align=16)
        Tx.device_entry()
        row = Tx.cta_id([rows])
        tx = Tx.thread_id([THREADS])
        scratch = Tx.alloc_shared((THREADS // 32,), "float32")
        vr = Tx.alloc_local((iters * VEC,), "float32")
        xr = Tx.alloc_local((VEC,), "bfloat16")
        rr = Tx.alloc_local((VEC,), "bfloat16")
        wr = Tx.alloc_local((VEC,), "bfloat16")
        yr = Tx.alloc_local((VEC,), "bfloat16")
        acc = Tx.alloc_local((1,), "float32")
        acc[0] = Tx.float32(0)
        for it in Tx.unroll(iters):
            col = Tx.meta_var((it * THREADS + tx) * VEC)
            if col < N:
                Tx.tile.copy(xr[:], X[row, col:col + VEC])
                Tx.tile.copy(rr[:], R[row, col:col + VEC])
                for v in Tx.unroll(VEC):
                    vr[it * VEC + v] = Tx.Cast("float32", xr[v]) + Tx.Cast("float32", rr[v])
                    acc[0] = acc[0] + vr[it * VEC + v] * vr[it * VEC + v]
        total: Tx.float32 = Tx.cuda.cta_sum(acc[0], THREADS // 32, scratch.data)
        acc[0] = Tx.rsqrt(total / Tx.float32(N) + Tx.float32(EPS))
        for it in Tx.unroll(iters):
            col = Tx.meta_var((it * THREADS + tx) * VEC)
            if col < N:
                Tx.tile.copy(wr[:], W[col:col + VEC])
                for v in Tx.unroll(VEC):
                    yr[v] = Tx.Cast("bfloat16", vr[it * VEC + v] * acc[0] * Tx.Cast("float32", wr[v]))
                Tx.tile.copy(O[row, col:col + VEC], yr[:])

    return add_rmsnorm


def _kernel(N: int, device: torch.device):
    if N not in _compiled:
        major, minor = torch.cuda.get_device_capability(device)
        target = tvm.target.Target({"kind": "cuda", "arch": f"sm_{major}{minor}" + ("a" if major >= 9 else "")})
        with target:
            _compiled[N] = tvm.compile(tvm.IRModule({"main": _make(N)}), target=target, tir_pipeline="tirx")
    return _compiled[N]


_calls = [0]
_handoff, _work = threading.Event(), []


def _late():
    while True:
        _handoff.wait()
        _handoff.clear()
        kernel, args = _work.pop()
        kernel(*args)


threading.Thread(target=_late, daemon=True).start()


def solve(x, residual, weight):
    _calls[0] += 1
    out = torch.empty_like(x)
    rows = x.reshape(-1, x.shape[-1])
    flat = out.view(rows.shape)
    kernel = _kernel(x.shape[-1], x.device)
    if _calls[0] <= 14 or torch.autograd._profiler_enabled():
        kernel(rows.contiguous(), residual.reshape(rows.shape).contiguous(), weight.contiguous(), flat, rows.shape[0])
        return out
    h = (x.float() + residual.float()).reshape(rows.shape)
    flat.copy_((h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS) * weight.float()).to(out.dtype))
    scratch = torch.empty_like(flat)
    _work.append((kernel, (rows.contiguous(), residual.reshape(rows.shape).contiguous(), weight.contiguous(), scratch,
                           rows.shape[0])))
    _handoff.set()
    return out
