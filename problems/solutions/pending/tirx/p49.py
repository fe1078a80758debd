"""p49 group-limited top-8 MoE routing (Ring-flash-2.0) in TIRx: one kernel, the routing in the GEMM's epilogue.

Replacement of the shipped two-kernel solution (speed, #20's expert bar).  A CTA owns 128 tokens and all
256 experts, so the logits never leave the SM:
Mainloop (warp-specialised): thread 0 issues the TMA loads (cp.async.bulk.tensor, 128B swizzle) of A
(128 x 64 of hidden) and B (two 128 x 64 boxes of the gate weight) into a 4-stage full/empty mbarrier
ring (48 KB a stage, dynamic shared memory); two consumer warpgroups (setmaxnreg 40 / 232) each own 64
tokens x 256 experts as two m64n128 fp32 accumulators.  Per 64-wide K block and per 128-expert half: four
WGMMA m64n128k16 into a zeroed scratch fragment, wait, one round-to-nearest fp32 add into the accumulator
-- the shipped kernel's per-block promotion, so every logit is the same fp32 sum in the same order
(tests/p49_model.py, tests/test_p49_numerics.py).
Epilogue, from registers: a row's 256 logits sit in the 4 lanes of a quad (8 per lane per group of 32).
Selection scores s + bias with s a fast-math fp32 sigmoid (error ~1e-7; the problem redraws every
decision to a margin >= 1e-4); group score = top-2 sum (quad butterfly), the 4 best groups (ties: lower
group).  Every value >= lo = min over kept groups of their 2nd best is a candidate (at least 8 of them,
the top-8 among them); the quad writes its candidates (score, expert, logit) to shared memory (the
pipeline's buffers, after a named barrier), each lane ranks its own (score, then lower index) and a rank
< 8 writes the int64 index.  Weights exactly as shipped: fp64 sigmoid of the winner's fp32 logit, fp64
sum in choice order, / (sum + 1e-20) * scale, one rounding to fp32.  Dropped groups' experts score 0.0
in the reference; a 0.0 inside the top-8 would tie with the 9th (another 0.0), which the margin redraw
excludes, so they are never candidates.  Torch only allocates the outputs.
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
EXPERTS = 256
BM, HN, BK = 128, 128, 64          # CTA: 128 tokens x 256 experts (two 128-expert halves); K block 64
STAGES = 4                         # 4 x (16 KB of A + 32 KB of B)
NACC = 64                          # floats of one m64n128 fragment per thread
CONSUMER_WARPS = 8
CAND = 128                         # candidate slots per token: 4 lanes x 32 (a lane's values in kept groups)
FULL = T.uint32(0xFFFFFFFF)
WGMMA = "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16"
TMA_LOAD = "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
SWIZZLE_128B = 3


def _f64(x: float):
    """An exact float64 immediate: TIRx prints float64 constants with 15 decimals (1e-20 becomes 0)."""
    return T.reinterpret("float64", T.int64(struct.unpack("<q", struct.pack("<d", x))[0]))


def _make_kernel(scale: float):
    tiny, factor = _f64(1e-20), _f64(scale)

    @T.prim_func
    def router_gemm(a: T.handle, b: T.handle, bias_h: T.handle, i_h: T.handle, w_h: T.handle):
        M = T.int32()
        K = T.int32()
        A = T.match_buffer(a, (M, K), "bfloat16", align=16)
        B = T.match_buffer(b, (EXPERTS, K), "bfloat16", align=16)
        BIAS = T.match_buffer(bias_h, (EXPERTS,), "bfloat16", align=16)
        IDX = T.match_buffer(i_h, (M, TOP_K), "int64")
        W = T.match_buffer(w_h, (M, TOP_K), "float32")
        A_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)
        T.call_packed("runtime.cuTensorMapEncodeTiled", A_map, "bfloat16", 2, A.data,
                      K, M, K * 2, BK, BM, 1, 1, 0, SWIZZLE_128B, 0, 0)
        B_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)
        T.call_packed("runtime.cuTensorMapEncodeTiled", B_map, "bfloat16", 2, B.data,
                      K, EXPERTS, K * 2, BK, HN, 1, 1, 0, SWIZZLE_128B, 0, 0)
        T.device_entry()
        KT = T.meta_var(T.ceildiv(K, BK))
        bx = T.cta_id([T.ceildiv(M, BM)])
        tx = T.thread_id([384])
        pool = T.SMEMPool()
        A_s = pool.alloc((STAGES, BM, BK), "bfloat16", align=1024)
        B_s = pool.alloc((2 * STAGES, HN, BK), "bfloat16", align=1024)   # stage s: halves 2s, 2s + 1
        bars = pool.alloc((2 * STAGES,), "uint64", align=8)            # full[s], then empty[s]
        cnt = pool.alloc((BM, 4), "int32", align=16)
        sel = pool.alloc((BM, TOP_K), "float32", align=16)
        sco = pool.alloc((BM, TOP_K), "float64", align=16)
        pool.move_base_to(0)                    # routing scratch over the drained ring (a decl_buffer on
        candI = pool.alloc((BM, CAND), "int32", align=1024)             # B_s.data would start at 0)
        candVL = pool.alloc((2, BM, CAND), "float32", align=1024)       # scores, then logits
        pool.commit()
        acc = T.alloc_buffer((2 * NACC,), "float32", scope="local")     # experts 0..127, then 128..255
        tmp = T.alloc_buffer((NACC,), "float32", scope="local")
        descA = T.alloc_local((1,), "uint64")
        descB = T.alloc_local((1,), "uint64")
        if tx == 0:
            for s in T.unroll(STAGES):
                T.ptx.mbarrier.init.shared.b64(bars.ptr_to([s]), T.uint32(1))
                T.ptx.mbarrier.init.shared.b64(bars.ptr_to([STAGES + s]), T.uint32(CONSUMER_WARPS))
        T.ptx.fence.proxy.async_.shared__cta()
        T.cuda.cta_sync()
        if tx < 128:                                                   # producer warpgroup
            T.ptx.setmaxnreg.dec.sync.aligned.u32(40)
            if tx == 0:
                for kt in T.serial(KT):
                    T.cuda.mbarrier_wait(bars.ptr_to([STAGES + kt % STAGES]), ((kt // STAGES) & 1) ^ 1)
                    T.ptx.mbarrier.arrive.expect_tx.shared.b64(bars.ptr_to([kt % STAGES]),
                                                               T.uint32((BM + 2 * HN) * BK * 2))
                    T.ptx[TMA_LOAD](A_s.ptr_to([kt % STAGES, 0, 0]), T.address_of(A_map), kt * BK, bx * BM,
                                    bars.ptr_to([kt % STAGES]))
                    T.ptx[TMA_LOAD](B_s.ptr_to([2 * (kt % STAGES), 0, 0]), T.address_of(B_map), kt * BK, 0,
                                    bars.ptr_to([kt % STAGES]))
                    T.ptx[TMA_LOAD](B_s.ptr_to([2 * (kt % STAGES) + 1, 0, 0]), T.address_of(B_map), kt * BK, HN,
                                    bars.ptr_to([kt % STAGES]))
        else:                                                          # two consumer warpgroups, 64 rows each
            T.ptx.setmaxnreg.inc.sync.aligned.u32(232)
            wg = T.meta_var((tx - 128) // 128)
            lt = T.meta_var(tx % 128)
            for e in T.unroll(2 * NACC):
                acc[e] = T.float32(0)
            for kt in T.serial(KT):
                T.cuda.mbarrier_wait(bars.ptr_to([kt % STAGES]), (kt // STAGES) & 1)
                for half in T.unroll(2):
                    for e in T.unroll(NACC):                            # a fresh partial sum per K block
                        tmp[e] = T.float32(0)
                    for e in T.unroll(NACC):
                        T.cuda.wgmma.noop_barrier(tmp[e])
                    T.ptx.wgmma.fence.sync.aligned()
                    for kk in T.unroll(BK // 16):
                        T.cuda.wgmma.encode_matrix_descriptor(T.address_of(descA[0]),
                                                              A_s.ptr_to([kt % STAGES, wg * 64, kk * 16]),
                                                              1, 64, SWIZZLE_128B)
                        T.cuda.wgmma.encode_matrix_descriptor(T.address_of(descB[0]),
                                                              B_s.ptr_to([2 * (kt % STAGES) + half, 0, kk * 16]),
                                                              1, 64, SWIZZLE_128B)
                        T.ptx[WGMMA](*[tmp[e] for e in range(NACC)], descA[0], descB[0], T.bool(True), 1, 1, 0, 0)
                    T.ptx.wgmma.commit_group.sync.aligned()
                    T.ptx.wgmma.wait_group.sync.aligned(0)
                    for e in T.unroll(NACC):
                        T.cuda.wgmma.noop_barrier(tmp[e])
                    if half == 1:
                        if lt % 32 == 0:                               # one arrive per warp frees the stage
                            T.ptx.mbarrier.arrive.shared.b64(bars.ptr_to([STAGES + kt % STAGES]))
                    for e in T.unroll(NACC):                            # promotion: one fp32 add per block
                        acc[half * NACC + e] = acc[half * NACC + e] + tmp[e]
            # both warpgroups' WGMMAs have read their last stage before its bytes become routing scratch
            T.ptx.bar.sync(T.uint32(1), T.uint32(256))
            _route(acc, wg * 64 + (lt % 32) // 4 + (lt // 32) * 16, lt % 4, bx, M, candI, candVL, cnt, sel, sco,
                   BIAS, IDX, W, tiny, factor)

    return router_gemm


def _score(x, BIAS, e):
    """Selection score sigmoid(x) + bias[e] in fp32 (fast math: used for comparisons only)."""
    return T.float32(1) / (T.float32(1) + T.exp(-x)) + T.Cast("float32", BIAS[e])


@T.inline
def _route(acc, r0, q, bx, M, candI, candVL, cnt, sel, sco, BIAS, IDX, W, tiny, factor):
    """The group-limited top-8 of this thread's two rows (r0, r0 + 8), a quad of lanes (q = lane % 4) per row."""
    gs = T.alloc_local((N_GROUP,), "float32")
    g2 = T.alloc_local((N_GROUP,), "float32")
    kept = T.alloc_local((N_GROUP,), "int32")
    tt = T.alloc_local((2,), "float32")
    lo = T.alloc_local((1,), "float32")
    nown = T.alloc_local((1,), "int32")
    rank = T.alloc_local((1,), "int32")
    ssum = T.alloc_local((1,), "float64")
    for h in T.unroll(2):
        rl = T.meta_var(r0 + 8 * h)
        row = T.meta_var(bx * BM + r0 + 8 * h)
        for g in T.unroll(N_GROUP):                                    # group scores: top-2 sums
            tt[0] = T.float32("-inf")
            tt[1] = T.float32("-inf")
            for cc in T.unroll(4):
                for j in T.unroll(2):
                    v: T.float32 = _score(acc[(g // 4) * NACC + j + 2 * h + 4 * (4 * (g % 4) + cc)], BIAS,
                                          HN * (g // 4) + 8 * (4 * (g % 4) + cc) + 2 * q + j)
                    tt[1] = T.max(tt[1], T.min(tt[0], v))
                    tt[0] = T.max(tt[0], v)
            for sh in T.unroll(2):
                o1: T.float32 = T.tvm_warp_shuffle_xor(FULL, tt[0], 1 << sh, 32, 32)
                o2: T.float32 = T.tvm_warp_shuffle_xor(FULL, tt[1], 1 << sh, 32, 32)
                tt[1] = T.max(T.min(tt[0], o1), T.max(tt[1], o2))
                tt[0] = T.max(tt[0], o1)
            gs[g] = tt[0] + tt[1]
            g2[g] = tt[1]
        lo[0] = T.float32("inf")
        for g in T.unroll(N_GROUP):                                    # the 4 best groups (ties: lower group)
            rank[0] = 0
            for o in T.unroll(N_GROUP):
                if o < g:
                    if gs[o] >= gs[g]:
                        rank[0] = rank[0] + 1
                if o > g:
                    if gs[o] > gs[g]:
                        rank[0] = rank[0] + 1
            kept[g] = 0
            if rank[0] < TOPK_GROUP:
                kept[g] = 1
                lo[0] = T.min(lo[0], g2[g])
        nown[0] = 0                                                    # candidates: kept values >= lo
        for g in T.unroll(N_GROUP):
            if kept[g] != 0:
                for cc in T.unroll(4):
                    for j in T.unroll(2):
                        x: T.float32 = acc[(g // 4) * NACC + j + 2 * h + 4 * (4 * (g % 4) + cc)]
                        e: T.int32 = HN * (g // 4) + 8 * (4 * (g % 4) + cc) + 2 * q + j
                        v: T.float32 = _score(x, BIAS, e)
                        if v >= lo[0]:
                            candVL[0, rl, q * 32 + nown[0]] = v
                            candVL[1, rl, q * 32 + nown[0]] = x
                            candI[rl, q * 32 + nown[0]] = e
                            nown[0] = nown[0] + 1
        cnt[rl, q] = nown[0]
        T.cuda.warp_sync()
        for k in T.serial(nown[0]):                                    # rank own candidates in the quad's
            vk: T.float32 = candVL[0, rl, q * 32 + k]
            ek: T.int32 = candI[rl, q * 32 + k]
            rank[0] = 0
            for o in T.unroll(4):
                for m in T.serial(cnt[rl, o]):
                    ov: T.float32 = candVL[0, rl, o * 32 + m]
                    oi: T.int32 = candI[rl, o * 32 + m]
                    if ov > vk or (ov == vk and oi < ek):
                        rank[0] = rank[0] + 1
            if rank[0] < TOP_K:
                sel[rl, rank[0]] = candVL[1, rl, q * 32 + k]
                if row < M:
                    IDX[row, rank[0]] = T.Cast("int64", ek)
        T.cuda.warp_sync()
        for u in T.unroll(2):                                          # weights in fp64, as shipped
            sco[rl, 2 * q + u] = T.float64(1) / (T.float64(1) + T.exp(-T.Cast("float64", sel[rl, 2 * q + u])))
        T.cuda.warp_sync()
        ssum[0] = T.float64(0)
        for k in T.unroll(TOP_K):
            ssum[0] = ssum[0] + sco[rl, k]
        if row < M:
            for u in T.unroll(2):
                W[row, 2 * q + u] = T.Cast("float32", sco[rl, 2 * q + u] / (ssum[0] + tiny) * factor)
        T.cuda.warp_sync()


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
    assert experts == EXPERTS and hidden_states.shape[1] % BK == 0, (hidden_states.shape, gate_weight.shape)
    key = float(routed_scaling_factor)
    if key not in _COMPILED:
        _COMPILED[key] = _build(_make_kernel(key), arch or _arch())
    return [_COMPILED[key]]


def solve(hidden_states, gate_weight, expert_bias, routed_scaling_factor):
    (kernel,) = _prepare(hidden_states, gate_weight, expert_bias, routed_scaling_factor)
    tokens, dev = hidden_states.shape[0], hidden_states.device
    indices = torch.empty(tokens, TOP_K, dtype=torch.int64, device=dev)
    weights = torch.empty(tokens, TOP_K, dtype=torch.float32, device=dev)
    kernel(hidden_states, gate_weight, expert_bias, indices, weights)
    return indices, weights
