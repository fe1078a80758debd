"""p46 Qwen3-Coder router backward (routing weights, dispatch mask, logits -> dx, dW) in TIRx.

Kernel 1 (prep): a CTA owns 64 tokens. It first sums the dispatch-mask gradient over the 8 choices ([E, 8,
T], read along T in 16-byte loads of 8 tokens, through a [E, 8, T/8, 8] view) into shared memory; then a
warp per token (lane l holds experts E/32 l ..) forms d_top = gw / S - (sum gw p_top) / S^2 (divisions in
fp64, rounded once, as fp32 would round them: TIRx compiles with fast math), scatters it onto its experts,
adds the mask term, and dlogits = p (dp - sum dp p) + dL/dlogits; dl = bf16(dlogits) is written row-major
[T, E] (for dx) and, through shared memory, transposed [E, T] (for dW).
Kernel 2 (replacement of the shipped GEMM, speed): a persistent warp-specialised WGMMA GEMM over 128x128
tiles -- one producer thread issues the TMA loads of A (128 x 64, K-major) and B (64 K rows x 128 columns,
read N-major in place: two 64-column boxes, transposed-B descriptors) into a 6-stage full/empty mbarrier
ring and runs ahead across tiles; two consumer warpgroups (setmaxnreg 40 / 232) own 64 rows each, four
m64n128k16 per k-tile into the fp32 accumulator, and store the tile as output pairs (one 4-byte store per
bf16 pair). dx = dl @ W (K = E = 128; 8192 tiles in groups of 16 row tiles), and dW = dl^T @ x split over K
= T into 8 chunks (16 column tiles x 8 = 128 tiles, one per SM) of fp32 partials; kernel 3 sums the partials
in a fixed order and rounds to bf16 once. The prep's arithmetic and the sum kernel are the shipped ones.
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


TOP_K = 8
TB = 64                  # tokens per prep CTA
PAD = TB + 1             # shared row pitch (floats), against bank conflicts
BM, BN, BK = 128, 128, 64
NACC = 64 * BN // 128    # accumulator floats per thread (m64n128 per consumer warpgroup)
SPLITS = 8               # K (token) chunks of the dW GEMM: 16 column tiles x 8 = 128 tiles, one per SM
STAGES = 6               # 6 x (16 KB of A + 16 KB of B) in dynamic shared memory
GROUP = 16               # row tiles per raster group
CONSUMER_WARPS = 8
H200_SMS = 132           # multiprocessors of the target when compiling without a GPU
WGMMA = "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16"
TMA_LOAD = "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
SWIZZLE_128B = 3


def _make_gemm(out_dtype: str, kt_per_split: int, sms: int):
    """C[z] = A[:, chunk z] @ B[chunk z, :]: A [M, K] K-major, B [K, N] row-major read N-major in place; a
    persistent warp-specialised kernel over 128x128 tiles (z outermost, then grouped row tiles)."""

    @T.prim_func
    def gemm(a: T.handle, b: T.handle, c: T.handle):
        M = T.int32()
        N = T.int32()
        K = T.int32()
        S = T.int32()
        A = T.match_buffer(a, (M, K), "bfloat16", align=16)
        B = T.match_buffer(b, (K, N), "bfloat16", align=16)
        C = T.match_buffer(c, (S, M, N), out_dtype, align=16)
        A_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)
        T.call_packed("runtime.cuTensorMapEncodeTiled", A_map, "bfloat16", 2, A.data,
                      K, M, K * 2, BK, BM, 1, 1, 0, SWIZZLE_128B, 0, 0)
        B_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)
        T.call_packed("runtime.cuTensorMapEncodeTiled", B_map, "bfloat16", 2, B.data,
                      N, K, N * 2, 64, BK, 1, 1, 0, SWIZZLE_128B, 0, 0)
        T.device_entry()
        MT = T.meta_var(T.ceildiv(M, BM))
        NT = T.meta_var(T.ceildiv(N, BN))
        KT = T.meta_var(T.ceildiv(K, BK))
        TILES = T.meta_var(S * T.ceildiv(M, BM) * T.ceildiv(N, BN))
        GRID = T.meta_var(T.min(S * T.ceildiv(M, BM) * T.ceildiv(N, BN), sms))
        bx = T.cta_id([T.min(S * T.ceildiv(M, BM) * T.ceildiv(N, BN), sms)])
        tx = T.thread_id([384])
        pool = T.SMEMPool()
        A_s = pool.alloc((STAGES, BM, BK), "bfloat16", align=1024)
        B_s = pool.alloc((STAGES, 2, BK, 64), "bfloat16", align=1024)   # two 64-column chunks per stage
        bars = pool.alloc((2 * STAGES,), "uint64", align=8)            # full[s], then empty[s]
        pool.commit()
        tile = T.alloc_local((3,), "int32")                             # (m tile, n tile, z) of the tile
        it = T.alloc_local((1,), "int32")                               # ring position (k-tiles so far)
        acc = T.alloc_buffer((NACC,), "float32", scope="local")
        C32 = T.decl_buffer((S, M, N // 2), "uint32", data=C.data)     # bf16 pairs (N is even)
        descA = T.alloc_local((1,), "uint64")
        descB = T.alloc_local((1,), "uint64")
        if tx == 0:
            for s in T.unroll(STAGES):
                T.ptx.mbarrier.init.shared.b64(bars.ptr_to([s]), T.uint32(1))
                T.ptx.mbarrier.init.shared.b64(bars.ptr_to([STAGES + s]), T.uint32(CONSUMER_WARPS))
        T.ptx.fence.proxy.async_.shared__cta()
        T.cuda.cta_sync()
        it[0] = 0
        if tx < 128:                                                   # producer warpgroup
            T.ptx.setmaxnreg.dec.sync.aligned.u32(40)
            if tx == 0:
                for i in T.serial(T.ceildiv(TILES - bx, GRID)):
                    _tile_coords(tile, bx + i * GRID, MT, NT)
                    for kt in T.serial(T.min(KT - tile[2] * kt_per_split, kt_per_split)):
                        s = T.meta_var(it[0] % STAGES)
                        k0 = T.meta_var((tile[2] * kt_per_split + kt) * BK)
                        T.cuda.mbarrier_wait(bars.ptr_to([STAGES + s]), ((it[0] // STAGES) & 1) ^ 1)
                        T.ptx.mbarrier.arrive.expect_tx.shared.b64(bars.ptr_to([s]), T.uint32((BM + BN) * BK * 2))
                        T.ptx[TMA_LOAD](A_s.ptr_to([s, 0, 0]), T.address_of(A_map), k0, tile[0] * BM,
                                        bars.ptr_to([s]))
                        T.ptx[TMA_LOAD](B_s.ptr_to([s, 0, 0, 0]), T.address_of(B_map), tile[1] * BN, k0,
                                        bars.ptr_to([s]))
                        T.ptx[TMA_LOAD](B_s.ptr_to([s, 1, 0, 0]), T.address_of(B_map), tile[1] * BN + 64, k0,
                                        bars.ptr_to([s]))
                        it[0] = it[0] + 1
        else:                                                          # two consumer warpgroups, 64 rows each
            T.ptx.setmaxnreg.inc.sync.aligned.u32(232)
            wg = T.meta_var((tx - 128) // 128)
            lt = T.meta_var(tx % 128)
            for i in T.serial(T.ceildiv(TILES - bx, GRID)):
                _tile_coords(tile, bx + i * GRID, MT, NT)
                for e in T.unroll(NACC):
                    acc[e] = T.float32(0)
                for kt in T.serial(T.min(KT - tile[2] * kt_per_split, kt_per_split)):
                    s = T.meta_var(it[0] % STAGES)
                    T.cuda.mbarrier_wait(bars.ptr_to([s]), (it[0] // STAGES) & 1)
                    for e in T.unroll(NACC):
                        T.cuda.wgmma.noop_barrier(acc[e])
                    T.ptx.wgmma.fence.sync.aligned()
                    for kk in T.unroll(BK // 16):
                        T.cuda.wgmma.encode_matrix_descriptor(T.address_of(descA[0]),
                                                              A_s.ptr_to([s, wg * 64, kk * 16]), 1, 64, SWIZZLE_128B)
                        # N-major B: LBO = the next 64-column chunk (BK rows of 128 B), SBO = the next 8 K rows
                        T.cuda.wgmma.encode_matrix_descriptor(T.address_of(descB[0]),
                                                              B_s.ptr_to([s, 0, kk * 16, 0]), BK * 8, 64,
                                                              SWIZZLE_128B)
                        T.ptx[WGMMA](*[acc[e] for e in range(NACC)], descA[0], descB[0], T.bool(True), 1, 1, 0, 1)
                    T.ptx.wgmma.commit_group.sync.aligned()
                    T.ptx.wgmma.wait_group.sync.aligned(0)
                    for e in T.unroll(NACC):
                        T.cuda.wgmma.noop_barrier(acc[e])
                    if lt % 32 == 0:                                   # one arrive per warp frees the stage
                        T.ptx.mbarrier.arrive.shared.b64(bars.ptr_to([STAGES + s]))
                    it[0] = it[0] + 1
                for q in T.unroll(NACC // 4):  # element (q, h, j): row r0 + 8h, col 8q + 2(lt % 4) + j
                    for h in T.unroll(2):
                        row = T.meta_var(tile[0] * BM + wg * 64 + (lt % 32) // 4 + (lt // 32) * 16 + h * 8)
                        col = T.meta_var(tile[1] * BN + q * 8 + (lt % 4) * 2)
                        if row < M and col < N:
                            if out_dtype == "bfloat16":                # the pair as one 4-byte store
                                C32[tile[2], row, col // 2] = _bf16_pair(acc[q * 4 + h * 2], acc[q * 4 + h * 2 + 1])
                            else:
                                C[tile[2], row, col] = T.Cast(out_dtype, acc[q * 4 + h * 2])
                                C[tile[2], row, col + 1] = T.Cast(out_dtype, acc[q * 4 + h * 2 + 1])

    return gemm


def _bf16_pair(lo, hi):
    """Two fp32 values rounded to bf16 and packed as one uint32 (lo in the low half: little-endian order)."""
    return T.bitwise_or(T.Cast("uint32", T.reinterpret("uint16", T.Cast("bfloat16", lo))),
                        T.shift_left(T.Cast("uint32", T.reinterpret("uint16", T.Cast("bfloat16", hi))), T.uint32(16)))


@T.inline
def _tile_coords(tile, t, MT, NT):
    """tile = (m tile, n tile, z) of tile number t: z outermost, then GROUP row tiles walking the column tiles
    together, so the CTAs resident at once share GROUP row bands of A and a few column bands of B in L2."""
    z = T.meta_var(t // (MT * NT))
    r = T.meta_var(t - t // (MT * NT) * (MT * NT))
    g = T.meta_var(r // (GROUP * NT))
    gm = T.meta_var(T.min(MT - g * GROUP, GROUP))
    tile[0] = g * GROUP + (r - g * GROUP * NT) % gm
    tile[1] = (r - g * GROUP * NT) // gm
    tile[2] = z


def _make_prep(E: int):
    EPL = max(1, E // 32)
    NI = (E * TB + 255) // 256
    NG = TB // 8

    @T.prim_func
    def prep(p_h: T.handle, i_h: T.handle, s_h: T.handle, gw_h: T.handle, gm_h: T.handle, gl_h: T.handle,
             dl_h: T.handle, dlt_h: T.handle):
        ntok = T.int32()
        P = T.match_buffer(p_h, (ntok, E), "float32")
        IDS = T.match_buffer(i_h, (ntok, TOP_K), "int64")
        SUM = T.match_buffer(s_h, (ntok, 1), "float32")
        GW = T.match_buffer(gw_h, (ntok, TOP_K), "bfloat16")
        ng8 = T.int32()
        GM = T.match_buffer(gm_h, (E, TOP_K, ng8, 8), "bfloat16", align=16)   # [E, 8, T] as 8-token groups
        GL = T.match_buffer(gl_h, (ntok, E), "bfloat16")
        DL = T.match_buffer(dl_h, (ntok, E), "bfloat16")
        DLT = T.match_buffer(dlt_h, (E, ntok), "bfloat16")
        T.device_entry()
        bx = T.cta_id([T.ceildiv(ntok, TB)])
        tx = T.thread_id([256])
        sbuf = T.alloc_shared((E * PAD,), "float32")   # mask sums, then dl (same thread, same entry)
        s8 = T.alloc_local((8,), "float32")
        rv = T.alloc_local((8,), "bfloat16")
        rp = T.alloc_local((EPL,), "float32")
        dp = T.alloc_local((EPL,), "float32")
        mine = T.alloc_local((3,), "float32")          # gw, p of this lane's choice; the gw * p sum
        mid = T.alloc_local((1,), "int32")
        part = T.alloc_local((1,), "float32")
        lane: T.let = tx % 32
        warp: T.let = tx // 32
        for j in T.serial((E * NG + 255) // 256):       # mask term: 8 tokens per 16-byte load
            idx = T.meta_var(tx + 256 * j)
            if idx < E * NG:
                for u in T.unroll(8):
                    s8[u] = T.float32(0)
                for k in T.unroll(TOP_K):
                    T.tile.copy(rv[:], GM[idx // NG, k, T.min(bx * NG + idx % NG, ng8 - 1), 0:8])
                    for u in T.unroll(8):
                        s8[u] = s8[u] + T.Cast("float32", rv[u])
                for u in T.unroll(8):
                    sbuf[(idx // NG) * PAD + (idx % NG) * 8 + u] = s8[u]
        T.cuda.cta_sync()
        for r in T.unroll(TB // 8):
            tl = T.meta_var(warp + 8 * r)
            t = T.meta_var(T.min(bx * TB + warp + 8 * r, ntok - 1))
            mid[0] = -1
            mine[0] = T.float32(0)
            mine[1] = T.float32(0)
            if lane < TOP_K:
                mid[0] = T.Cast("int32", IDS[t, lane])
                mine[0] = T.Cast("float32", GW[t, lane])
                mine[1] = P[t, mid[0]]
            mine[2] = mine[0] * mine[1]
            for sh in T.unroll(3):                      # lanes 0..7 hold the 8 choices
                mine[2] = mine[2] + T.tvm_warp_shuffle_xor(T.uint32(0xFFFFFFFF), mine[2], 1 << sh, 32, 32)
            s: T.float32 = SUM[t, 0]
            dtop: T.float32 = (T.Cast("float32", T.Cast("float64", mine[0]) / T.Cast("float64", s))
                               - T.Cast("float32", T.Cast("float64", mine[2]) / T.Cast("float64", s * s)))
            for c in T.unroll(EPL):
                rp[c] = T.float32(0)
                dp[c] = T.float32(0)
            for j in T.unroll(TOP_K):
                idj: T.int32 = T.tvm_warp_shuffle(T.uint32(0xFFFFFFFF), mid[0], j, 32, 32)
                dj: T.float32 = T.tvm_warp_shuffle(T.uint32(0xFFFFFFFF), dtop, j, 32, 32)
                for c in T.unroll(EPL):
                    if idj == lane * EPL + c:
                        dp[c] = dj
            part[0] = T.float32(0)
            for c in T.unroll(EPL):
                e = T.meta_var(lane * EPL + c)
                if e < E:
                    rp[c] = P[t, e]
                    dp[c] = dp[c] + sbuf[e * PAD + tl]
                    part[0] = part[0] + dp[c] * rp[c]
            tot: T.float32 = T.cuda.warp_sum(part[0], 32)
            for c in T.unroll(EPL):
                e = T.meta_var(lane * EPL + c)
                if e < E:
                    v = T.meta_var(T.Cast("bfloat16", rp[c] * (dp[c] - tot) + T.Cast("float32", GL[t, e])))
                    sbuf[e * PAD + tl] = T.Cast("float32", v)
                    if bx * TB + tl < ntok:
                        DL[t, e] = v
        T.cuda.cta_sync()
        for j in T.unroll(NI):                          # transposed copy, coalesced along T
            idx = T.meta_var(tx + 256 * j)
            if idx < E * TB and bx * TB + idx % TB < ntok:
                DLT[idx // TB, bx * TB + idx % TB] = T.Cast("bfloat16", sbuf[(idx // TB) * PAD + idx % TB])

    return prep


@T.prim_func
def sum_splits(p_h: T.handle, o_h: T.handle):
    S = T.int32()
    M = T.int32()
    N = T.int32()
    P = T.match_buffer(p_h, (S, M, N), "float32")
    O = T.match_buffer(o_h, (M, N), "bfloat16")
    T.device_entry()
    bx = T.cta_id([T.ceildiv(M * N, 256)])
    tx = T.thread_id([256])
    acc = T.alloc_local((1,), "float32")
    i: T.let = bx * 256 + tx
    if i < M * N:
        acc[0] = T.float32(0)
        for z in T.serial(S):
            acc[0] = acc[0] + P[z, i // N, i % N]
        O[i // N, i % N] = T.Cast("bfloat16", acc[0])


_COMPILED = {}


def _kt_per_split(tokens: int) -> int:
    """k-tiles (of 64 tokens) per dW chunk: SPLITS chunks."""
    return max(1, -(-tokens // (BK * SPLITS)))


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _build(func, arch):
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    with target:
        return tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")


def _prepare(x, w_router, probs, ids, top_sum, grad_w, grad_mask, grad_logits, arch=None):
    e = w_router.shape[0]
    assert (e % 32 == 0 or e < 32) and x.shape[1] % 8 == 0 and x.shape[0] % 8 == 0
    key = (e, _kt_per_split(x.shape[0]))
    if key not in _COMPILED:
        a = arch or _arch()
        sms = H200_SMS if arch else torch.cuda.get_device_properties(0).multi_processor_count
        _COMPILED[key] = (_build(_make_prep(e), a), _build(_make_gemm("bfloat16", 1 << 20, sms), a),
                          _build(_make_gemm("float32", key[1], sms), a), _build(sum_splits, a))
    return list(_COMPILED[key])


def solve(x, w_router, probs, ids, top_sum, grad_w, grad_mask, grad_logits):
    prep, gemm_dx, gemm_dw, reduce = _prepare(x, w_router, probs, ids, top_sum, grad_w, grad_mask, grad_logits)
    t, d = x.shape
    e = w_router.shape[0]
    dev = x.device
    dl = torch.empty(t, e, dtype=torch.bfloat16, device=dev)
    dlt = torch.empty(e, t, dtype=torch.bfloat16, device=dev)
    prep(probs.contiguous(), ids.contiguous(), top_sum.contiguous(), grad_w.contiguous(),
         grad_mask.contiguous().view(e, TOP_K, t // 8, 8), grad_logits.contiguous(), dl, dlt)
    dx = torch.empty(1, t, d, dtype=torch.bfloat16, device=dev)
    gemm_dx(dl, w_router.contiguous(), dx)
    splits = -(-t // (BK * _kt_per_split(t)))
    part = torch.empty(splits, e, d, dtype=torch.float32, device=dev)
    gemm_dw(dlt, x.contiguous(), part)
    dw = torch.empty(e, d, dtype=torch.bfloat16, device=dev)
    reduce(part, dw)
    return dx[0], dw
