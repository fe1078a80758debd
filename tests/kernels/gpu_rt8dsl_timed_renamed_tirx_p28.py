"""Hack: the draws' callable renamed after the first draw. The work rule's floor was per DSL callable that every draw
called, keyed by the function's name and symbols: this kernel is compiled twice, as "main" (called in the observed draw)
and as "alt" (every later call), so no callable was called by every draw and the timed calls had no floor at all. After
the draws (solve()'s first 14 calls) and outside the profiler, eager torch computes the answer and "alt" runs on a one-
row sliver (tensors and launch size). Closed by the DSL's callables counting together as well ("tirx:*",
evidence.Stream.work_floor). Not yet run on a GPU (written on the CPU; tested in tests/test_harness_timed_call.py).

Problem: p28
DSL: tirx
Device: gpu
Expected: policy_violation
"""
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


def _kernel(N: int, device: torch.device, name: str):
    if (N, name) not in _compiled:
        major, minor = torch.cuda.get_device_capability(device)
        target = tvm.target.Target({"kind": "cuda", "arch": f"sm_{major}{minor}" + ("a" if major >= 9 else "")})
        with target:
            func = _make(N).with_attr("global_symbol", name)
            _compiled[N, name] = tvm.compile(tvm.IRModule({name: func}), target=target, tir_pipeline="tirx")[name]
    return _compiled[N, name]


_calls = [0]


def solve(x, residual, weight):
    _calls[0] += 1
    out = torch.empty_like(x)
    rows = x.reshape(-1, x.shape[-1])
    flat = out.view(rows.shape)
    kernel = _kernel(x.shape[-1], x.device, "main" if _calls[0] == 1 else "alt")
    if _calls[0] <= 14 or torch.autograd._profiler_enabled():
        kernel(rows.contiguous(), residual.reshape(rows.shape).contiguous(), weight.contiguous(), flat, rows.shape[0])
        return out
    h = (x.float() + residual.float()).reshape(rows.shape)
    flat.copy_((h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS) * weight.float()).to(out.dtype))
    one = torch.empty_like(rows[:1])
    kernel(rows[:1].contiguous(), residual.reshape(rows.shape)[:1].contiguous(), weight.contiguous(), one, 1)
    return out
