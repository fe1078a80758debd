"""p28 fused residual add + RMSNorm (bf16) in TIRx: one CTA per row, row kept in registers.

s = x + residual (fp32); out = s * rsqrt(mean(s^2) + eps) * weight, rounded once.  One read of
x/residual, one write of out (128-bit accesses).
"""
import torch  # before tvm, so TVM's CUDA runtime finds the already-loaded CUDA libraries

import tvm
from tvm.script import tirx as T

EPS = 1e-5
VEC, THREADS = 8, 128


def _make(N: int):
    ITERS = (N + VEC * THREADS - 1) // (VEC * THREADS)

    @T.prim_func
    def add_rmsnorm(x: T.handle, r: T.handle, w: T.handle, o: T.handle):
        m = T.int32()
        X = T.match_buffer(x, (m, N), "bfloat16", align=16)
        R = T.match_buffer(r, (m, N), "bfloat16", align=16)
        W = T.match_buffer(w, (N,), "bfloat16", align=16)
        O = T.match_buffer(o, (m, N), "bfloat16", align=16)
        T.device_entry()
        row = T.cta_id([m])
        tx = T.thread_id([THREADS])
        scratch = T.alloc_shared((THREADS // 32,), "float32")
        xr = T.alloc_local((VEC,), "bfloat16")
        rr = T.alloc_local((VEC,), "bfloat16")
        sv = T.alloc_local((ITERS * VEC,), "float32")      # fp32 sum s kept in registers
        wr = T.alloc_local((VEC,), "bfloat16")
        yr = T.alloc_local((VEC,), "bfloat16")
        acc = T.alloc_local((1,), "float32")
        acc[0] = T.float32(0)
        for it in T.unroll(ITERS):
            col = T.meta_var((it * THREADS + tx) * VEC)
            if col < N:
                T.tile.copy(xr[:], X[row, col:col + VEC])
                T.tile.copy(rr[:], R[row, col:col + VEC])
                for v in T.unroll(VEC):
                    sv[it * VEC + v] = T.Cast("float32", xr[v]) + T.Cast("float32", rr[v])
                    acc[0] = acc[0] + sv[it * VEC + v] * sv[it * VEC + v]
        total: T.float32 = T.cuda.cta_sum(acc[0], THREADS // 32, scratch.data)
        acc[0] = T.rsqrt(total / T.float32(N) + T.float32(EPS))
        for it in T.unroll(ITERS):
            col = T.meta_var((it * THREADS + tx) * VEC)
            if col < N:
                T.tile.copy(wr[:], W[col:col + VEC])
                for v in T.unroll(VEC):
                    yr[v] = T.Cast("bfloat16", sv[it * VEC + v] * acc[0] * T.Cast("float32", wr[v]))
                T.tile.copy(O[row, col:col + VEC], yr[:])

    return add_rmsnorm


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _build(func, arch):
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    with target:
        return tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")


def _prepare(x, residual, weight, arch=None):
    n = x.shape[-1]
    if n not in _COMPILED:
        assert n % VEC == 0
        _COMPILED[n] = _build(_make(n), arch or _arch())
    return [_COMPILED[n]]


def solve(x, residual, weight):
    (exe,) = _prepare(x, residual, weight)
    n = x.shape[-1]
    x2, r2 = x.reshape(-1, n).contiguous(), residual.reshape(-1, n).contiguous()
    out = torch.empty_like(x2)
    exe(x2, r2, weight.contiguous(), out)
    return out.view(x.shape)
