"""Honest: a two-kernel TIRx pipeline whose second kernel reads rows through indices the first wrote (unsigned, as gather indices are), as MoE dispatch and paged gathers do, and checks each index against the row count before it reads (a trap when it is out of range, as torch's own index kernels assert). A knocked-out draw poisons the indices (bitwise-not: 0xFFFFFFFF and below), the check traps and the CUDA context dies; that failed draw is the knock-out's evidence and a fresh candidate process runs the rest of the grading (details.relieved). Without the check, on the H100 (2026-12-07), the wild rows read no memory past the pool: TVM's CUDA code adds a tile copy's element offset to its pointer as a 32-bit int (`tvm_builtin_pointer_offset(T*, int)`), so the 64-bit row offset wrapped to a few KiB before the buffer, the gather read the allocator's own memory, and the draw was merely wrong.

Problem: p28
DSL: tirx
Device: gpu
Expected: passed
"""
import torch
import tvm
from tvm.script import tirx as Tx

VEC, THREADS, EPS = 8, 128, 1e-5
_compiled = {}


def _make(N: int):
    iters = (N + VEC * THREADS - 1) // (VEC * THREADS)

    @Tx.prim_func
    def row_stats(x: Tx.handle, r: Tx.handle, i: Tx.handle, v: Tx.handle):
        m = Tx.int32()
        X = Tx.match_buffer(x, (m, N), "bfloat16", align=16)
        R = Tx.match_buffer(r, (m, N), "bfloat16", align=16)
        Idx = Tx.match_buffer(i, (m,), "int32")
        Inv = Tx.match_buffer(v, (m,), "float32")
        Tx.device_entry()
        row = Tx.cta_id([m])
        tx = Tx.thread_id([THREADS])
        scratch = Tx.alloc_shared((THREADS // 32,), "float32")
        xr = Tx.alloc_local((VEC,), "bfloat16")
        rr = Tx.alloc_local((VEC,), "bfloat16")
        acc = Tx.alloc_local((1,), "float32")
        acc[0] = Tx.float32(0)
        for it in Tx.unroll(iters):
            col = Tx.meta_var((it * THREADS + tx) * VEC)
            if col < N:
                Tx.tile.copy(xr[:], X[row, col:col + VEC])
                Tx.tile.copy(rr[:], R[row, col:col + VEC])
                for e in Tx.unroll(VEC):
                    s = Tx.meta_var(Tx.Cast("float32", xr[e]) + Tx.Cast("float32", rr[e]))
                    acc[0] = acc[0] + s * s
        total: Tx.float32 = Tx.cuda.cta_sum(acc[0], THREADS // 32, scratch.data)
        if tx == 0:
            Inv[row] = Tx.rsqrt(total / Tx.float32(N) + Tx.float32(EPS))
            Idx[row] = row

    @Tx.prim_func
    def gather_rows(x: Tx.handle, r: Tx.handle, w: Tx.handle, i: Tx.handle, v: Tx.handle, o: Tx.handle):
        m = Tx.int32()
        X = Tx.match_buffer(x, (m, N), "bfloat16", align=16)
        R = Tx.match_buffer(r, (m, N), "bfloat16", align=16)
        W = Tx.match_buffer(w, (N,), "bfloat16", align=16)
        Idx = Tx.match_buffer(i, (m,), "int32")
        Inv = Tx.match_buffer(v, (m,), "float32")
        O = Tx.match_buffer(o, (m, N), "bfloat16", align=16)
        Tx.device_entry()
        row = Tx.cta_id([m])
        tx = Tx.thread_id([THREADS])
        xr = Tx.alloc_local((VEC,), "bfloat16")
        rr = Tx.alloc_local((VEC,), "bfloat16")
        wr = Tx.alloc_local((VEC,), "bfloat16")
        yr = Tx.alloc_local((VEC,), "bfloat16")
        src = Tx.meta_var(Tx.Cast("int64", Tx.Cast("uint32", Idx[row])))
        Tx.cuda.trap_when_assert_failed(Tx.Cast("uint32", Idx[row]) < Tx.Cast("uint32", m))  # a bounds check
        for it in Tx.unroll(iters):
            col = Tx.meta_var((it * THREADS + tx) * VEC)
            if col < N:
                Tx.tile.copy(xr[:], X[src, col:col + VEC])
                Tx.tile.copy(rr[:], R[src, col:col + VEC])
                Tx.tile.copy(wr[:], W[col:col + VEC])
                for e in Tx.unroll(VEC):
                    s = Tx.meta_var(Tx.Cast("float32", xr[e]) + Tx.Cast("float32", rr[e]))
                    yr[e] = Tx.Cast("bfloat16", s * Inv[src] * Tx.Cast("float32", wr[e]))
                Tx.tile.copy(O[row, col:col + VEC], yr[:])

    return row_stats, gather_rows


def _target(device: torch.device):
    major, minor = torch.cuda.get_device_capability(device)
    return tvm.target.Target({"kind": "cuda", "arch": f"sm_{major}{minor}" + ("a" if major >= 9 else "")})


def _kernels(N: int, target):
    if N not in _compiled:
        with target:
            _compiled[N] = tuple(tvm.compile(tvm.IRModule({"main": f}), target=target, tir_pipeline="tirx")
                                 for f in _make(N))
    return _compiled[N]


def solve(x, residual, weight):
    stats, gather = _kernels(x.shape[-1], _target(x.device))
    m = x.shape[0]
    idx = torch.empty(m, dtype=torch.int32, device=x.device)
    inv = torch.empty(m, dtype=torch.float32, device=x.device)
    x, residual = x.contiguous(), residual.contiguous()
    stats(x, residual, idx, inv)
    out = torch.empty_like(x)
    gather(x, residual, weight.contiguous(), idx, inv, out)
    return out
