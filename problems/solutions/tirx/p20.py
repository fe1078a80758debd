"""p20 DeepSeek MLA prologue (q projection, NeoX RoPE on q and k_pe, compressed paged-cache write) in TIRx.

Kernel 1 is p60's bf16 WGMMA GEMM (64x128 CTA tiles, TMA with 128-byte swizzle, N tiles fastest) without
the scale promotion, reading q_c in place from qkv_lora (the tensor map's row stride is 2112 elements):
q = q_c @ q_b_weight^T with fp32 accumulation as cuBLAS, rounded to bf16, written straight into the
[tokens, 16 * 192] output (the weight is head-major: nope 128 then rope 64 per head).
Kernel 2, a CTA of 128 threads per token, rotates in place the 16 heads' rope halves of q (4 of the 512
(i, i + 32) pairs per thread) and, in warp 0, k_pe; each product and each sum is rounded to bf16 as
the reference's bf16 arithmetic does (the products of two bf16 numbers are exact in fp32, so fast math
changes nothing and this is torch's rounding bit for bit).  For a valid slot it writes [kv_c | rotated
k_pe] into the cache row slot of the flat [blocks * 16, 576] view; slot -1 writes nothing.
"""
import torch  # before tvm, so TVM's CUDA runtime finds the already-loaded CUDA libraries

import tvm
from tvm.backend.cuda.codegen.registry import CODEGEN_REGISTRY, register_codegen
from tvm.script import tirx as T


# apache-tvm 0.27.0.post1: the wgmma.noop_barrier codegen reads `reg.dtype`, which a buffer element
# lacks; re-register it to read the dtype from the type (the workaround verified on the H200).
@register_codegen("cuda_wgmma_noop_barrier")
def _noop_barrier(reg):
    d = getattr(reg, "dtype", None)
    dt = str(d) if d is not None else str(reg.ty.dtype)
    name = {"uint32": "tirx.cuda_wgmma_noop_barrier_uint32", "float32": "tirx.cuda_wgmma_noop_barrier_float32"}[dt]
    res = CODEGEN_REGISTRY[name]([reg])
    return res[0] if isinstance(res, tuple) else res


HEADS, NOPE, ROPE, KV_RANK, Q_RANK = 16, 128, 64, 512, 1536
HALF = ROPE // 2
WIDTH = Q_RANK + KV_RANK + ROPE
THREADS = 128
PAIRS = HEADS * HALF // THREADS               # q rope pairs per thread
BM, BN, BK = 64, 128, 64                     # BK = 64 bf16 = one 128-byte swizzle row
NACC = BM * BN // 128
WGMMA = "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16"
TMA_LOAD = "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
SWIZZLE_128B = 3


def _bf(x):
    """x rounded to bf16 and back (the reference's bf16 arithmetic, round to nearest even)."""
    return T.Cast("float32", T.Cast("bfloat16", x))


def _make_rope():
    QW = HEADS * (NOPE + ROPE)

    @T.prim_func
    def rope_cache(q_h: T.handle, x_h: T.handle, p_h: T.handle, cs_h: T.handle, s_h: T.handle, c_h: T.handle):
        m = T.int32()
        npos = T.int32()
        nslot = T.int32()
        Q = T.match_buffer(q_h, (m, QW), "bfloat16")
        X = T.match_buffer(x_h, (m, WIDTH), "bfloat16")
        POS = T.match_buffer(p_h, (m,), "int64")
        CS = T.match_buffer(cs_h, (npos, ROPE), "bfloat16")
        SLOT = T.match_buffer(s_h, (m,), "int64")
        C = T.match_buffer(c_h, (nslot, KV_RANK + ROPE), "bfloat16")
        T.device_entry()
        tok = T.cta_id([m])
        tx = T.thread_id([THREADS])
        pos = T.alloc_local((1,), "int32")
        slot = T.alloc_local((1,), "int32")
        v = T.alloc_local((4,), "float32")
        pos[0] = T.Cast("int32", POS[tok])
        slot[0] = T.Cast("int32", SLOT[tok])
        for r in T.unroll(PAIRS):
            p = T.meta_var(r * THREADS + tx)
            i = T.meta_var(p % HALF)
            base = T.meta_var((p // HALF) * (NOPE + ROPE) + NOPE + p % HALF)
            v[0] = T.Cast("float32", CS[pos[0], i])
            v[1] = T.Cast("float32", CS[pos[0], HALF + i])
            v[2] = T.Cast("float32", Q[tok, base])
            v[3] = T.Cast("float32", Q[tok, base + HALF])
            Q[tok, base] = T.Cast("bfloat16", _bf(v[2] * v[0]) - _bf(v[3] * v[1]))
            Q[tok, base + HALF] = T.Cast("bfloat16", _bf(v[3] * v[0]) + _bf(v[2] * v[1]))
        if slot[0] >= 0:
            if tx < HALF:
                v[0] = T.Cast("float32", CS[pos[0], tx])
                v[1] = T.Cast("float32", CS[pos[0], HALF + tx])
                v[2] = T.Cast("float32", X[tok, Q_RANK + KV_RANK + tx])
                v[3] = T.Cast("float32", X[tok, Q_RANK + KV_RANK + HALF + tx])
                C[slot[0], KV_RANK + tx] = T.Cast("bfloat16", _bf(v[2] * v[0]) - _bf(v[3] * v[1]))
                C[slot[0], KV_RANK + HALF + tx] = T.Cast("bfloat16", _bf(v[3] * v[0]) + _bf(v[2] * v[1]))
            for e in T.unroll(KV_RANK // THREADS):
                C[slot[0], e * THREADS + tx] = X[tok, Q_RANK + e * THREADS + tx]

    return rope_cache


def _make_gemm(K: int, LDA: int, N: int):
    """C(M,N) = A(M,K) @ B(N,K)^T with A the first K columns of rows of length LDA (q_c inside qkv_lora, read
    in place through the tensor map's row stride), bf16 operands, fp32 accumulation, C rounded to bf16."""

    @T.prim_func
    def gemm(a: T.handle, b: T.handle, c: T.handle):
        M = T.int32()
        A = T.match_buffer(a, (M, LDA), "bfloat16", align=16)
        B = T.match_buffer(b, (N, K), "bfloat16", align=16)
        C = T.match_buffer(c, (M, N), "bfloat16", align=16)
        A_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)
        T.call_packed("runtime.cuTensorMapEncodeTiled", A_map, "bfloat16", 2, A.data,
                      K, M, LDA * 2, BK, BM, 1, 1, 0, SWIZZLE_128B, 0, 0)
        B_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)
        T.call_packed("runtime.cuTensorMapEncodeTiled", B_map, "bfloat16", 2, B.data,
                      K, N, K * 2, BK, BN, 1, 1, 0, SWIZZLE_128B, 0, 0)
        T.device_entry()
        bn, bm = T.cta_id([T.ceildiv(N, BN), T.ceildiv(M, BM)])
        tx = T.thread_id([128])
        A_s = T.alloc_buffer((BM, BK), "bfloat16", scope="shared", align=1024)
        B_s = T.alloc_buffer((BN, BK), "bfloat16", scope="shared", align=1024)
        bar = T.shared_scalar("uint64")
        phase = T.alloc_local((1,), "int32")
        acc = T.alloc_buffer((NACC,), "float32", scope="local")
        descA = T.alloc_local((1,), "uint64")
        descB = T.alloc_local((1,), "uint64")
        if tx == 0:
            T.ptx.mbarrier.init.shared.b64(T.address_of(bar), T.uint32(1))
        T.ptx.fence.proxy.async_.shared__cta()
        T.cuda.cta_sync()
        phase[0] = 0
        for i in T.unroll(NACC):
            acc[i] = T.float32(0)
        for kt in T.serial(T.ceildiv(K, BK)):
            if tx == 0:
                T.ptx[TMA_LOAD](A_s.data, T.address_of(A_map), kt * BK, bm * BM, T.address_of(bar))
                T.ptx[TMA_LOAD](B_s.data, T.address_of(B_map), kt * BK, bn * BN, T.address_of(bar))
                T.ptx.mbarrier.arrive.expect_tx.shared.b64(T.address_of(bar), T.uint32((BM + BN) * BK * 2))
            T.cuda.mbarrier_wait(T.address_of(bar), phase[0])
            phase[0] = phase[0] ^ 1
            for i in T.unroll(NACC):
                T.cuda.wgmma.noop_barrier(acc[i])
            T.ptx.wgmma.fence.sync.aligned()
            for kk in T.unroll(BK // 16):
                T.cuda.wgmma.encode_matrix_descriptor(T.address_of(descA[0]), A_s.ptr_to([0, kk * 16]), 1, 64,
                                                      SWIZZLE_128B)
                T.cuda.wgmma.encode_matrix_descriptor(T.address_of(descB[0]), B_s.ptr_to([0, kk * 16]), 1, 64,
                                                      SWIZZLE_128B)
                T.ptx[WGMMA](*[acc[i] for i in range(NACC)], descA[0], descB[0], T.bool(True), 1, 1, 0, 0)
            T.ptx.wgmma.commit_group.sync.aligned()
            T.ptx.wgmma.wait_group.sync.aligned(0)
            for i in T.unroll(NACC):
                T.cuda.wgmma.noop_barrier(acc[i])
            T.cuda.cta_sync()              # smem is reused by the next TMA load
        for i in T.unroll(NACC // 4):      # fragment element (i, h, j): row r0 + 8h, col 8i + 2(tx%4) + j
            for h in T.unroll(2):
                for j in T.unroll(2):
                    row = T.meta_var(bm * BM + (tx % 32) // 4 + (tx // 32) * 16 + h * 8)
                    col = T.meta_var(bn * BN + i * 8 + (tx % 4) * 2 + j)
                    if row < M and col < N:
                        C[row, col] = T.Cast("bfloat16", acc[i * 4 + h * 2 + j])

    return gemm


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _build(func, arch):
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    with target:
        return tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")


def _prepare(qkv_lora, q_b_weight, positions, cos_sin_cache, slot_mapping, kv_cache, arch=None):
    n = q_b_weight.shape[0]
    assert qkv_lora.shape[1] == WIDTH and n == HEADS * (NOPE + ROPE) and kv_cache.shape[-1] == KV_RANK + ROPE
    if "fns" not in _COMPILED:
        arch = arch or _arch()
        _COMPILED["fns"] = (_build(_make_gemm(Q_RANK, WIDTH, n), arch), _build(_make_rope(), arch))
    return list(_COMPILED["fns"])


def solve(qkv_lora, q_b_weight, positions, cos_sin_cache, slot_mapping, kv_cache):
    gemm, rope = _prepare(qkv_lora, q_b_weight, positions, cos_sin_cache, slot_mapping, kv_cache)
    tokens = qkv_lora.shape[0]
    q = torch.empty(tokens, HEADS * (NOPE + ROPE), dtype=qkv_lora.dtype, device=qkv_lora.device)
    gemm(qkv_lora, q_b_weight, q)
    rope(q, qkv_lora, positions, cos_sin_cache, slot_mapping, kv_cache.view(-1, kv_cache.shape[-1]))
    return q.view(tokens, HEADS, NOPE + ROPE)
