"""p44 DeepSeek-V3 MoE layer on one EP rank (FP8 block-scaled SwiGLU experts), every step in TIRx.

1. Routing, a warp per token: sigmoid (fp64, rounded once), + bias (bf16 read in the kernel), group
   score = top-2 sum per group of 32, top-4 groups, 8 rounds of a warp arg-max, weights
   fp32(s / sum s) * routed scale (the scale and the local offset are compile-time constants).
2. Dispatch, a CTA per local expert (no atomics, deterministic): count, then the expert's row offset in
   a gathered buffer whose segments are padded to the 64-row GEMM tile, the rows of its pairs in token
   order, the tile -> expert map; CTA 0 marks the other ranks' pairs (-1).
3. Gather: the fp8 rows of hidden_states and their 56 activation scales (block-major [56, T] input).
4. Decode: gemm2's e4m3 codes to bf16, exactly (the codes, not code * scale).
5. GEMM1, FP8 WGMMA m64n128k32 e4m3 x e4m3 -> fp32 over each expert's row segment: the B tile stacks 64
   up rows and the matching 64 gate rows of the expert (two boxes of a 3-D [E, N, K] tensor map), each
   128-wide K block goes into a scratch accumulator promoted into fp32 with x_scale[row] * w_scale
   (per-block promotion, up and gate halves with their own weight-block scale); epilogue
   a = silu(gate) * up (sigmoid in fp64, rounded once), rounded to bf16 (the GEMM2 operand).
6. GEMM2, bf16 WGMMA m64n128k16 over the decoded codes, each 64-wide K tile promoted with its 128x128
   block scale; y in fp32.
7. Combine, a CTA per token: out = sum of weight * y over the token's local experts, fp32, one bf16
   rounding (tokens without a local expert get 0).
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


N_GROUP, TOPK_GROUP, TOP_K = 8, 4, 8
BLOCK = 128                        # scale block
BM = 64                            # GEMM m-tile = padding of each expert's row segment
NACC = BM * 128 // 128             # m64n128 fragment: 64 floats a thread
HALF = 64                          # GEMM1 output columns per CTA (up half + gate half = 128 B rows)
WGMMA_F8 = "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3"
WGMMA_BF = "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16"
TMA_2D = "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
TMA_3D = "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
SWIZZLE_128B = 3


def _make_router(E: int, SCALE: float):
    @T.prim_func
    def router(l_h: T.handle, b_h: T.handle, i_h: T.handle, w_h: T.handle):
        ntok = T.int32()
        LG = T.match_buffer(l_h, (ntok, E), "float32", align=16)
        BIAS = T.match_buffer(b_h, (E,), "bfloat16", align=16)
        IDX = T.match_buffer(i_h, (ntok, TOP_K), "int32")
        W = T.match_buffer(w_h, (ntok, TOP_K), "float32")
        T.device_entry()
        bx = T.cta_id([T.ceildiv(ntok, 4)])
        tx = T.thread_id([128])
        rl = T.alloc_local((8,), "float32")
        rb = T.alloc_local((8,), "bfloat16")
        sc = T.alloc_local((8,), "float32")
        val = T.alloc_local((8,), "float32")
        tt = T.alloc_local((2,), "float32")          # top-1, top-2 of the group
        best = T.alloc_local((2,), "float32")        # value, score of the running arg-max
        bi = T.alloc_local((1,), "int32")
        rank = T.alloc_local((1,), "int32")
        mine = T.alloc_local((1,), "float32")        # this lane's chosen score (lanes < 8)
        mi = T.alloc_local((1,), "int32")
        ssum = T.alloc_local((1,), "float64")
        lane: T.let = tx % 32
        t: T.let = bx * 4 + tx // 32
        if t < ntok:
            T.tile.copy(rl[:], LG[t, lane * 8:lane * 8 + 8])
            T.tile.copy(rb[:], BIAS[lane * 8:lane * 8 + 8])
            tt[0] = T.float32("-inf")
            tt[1] = T.float32("-inf")
            for e in T.unroll(8):
                sc[e] = T.Cast("float32", T.float64(1) / (T.float64(1) + T.exp(-T.Cast("float64", rl[e]))))
                val[e] = sc[e] + T.Cast("float32", rb[e])
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
            if rank[0] >= TOPK_GROUP:
                for e in T.unroll(8):
                    val[e] = T.float32("-inf")
            ssum[0] = T.float64(0)
            mine[0] = T.float32(0)
            mi[0] = 0
            for k in T.unroll(TOP_K):
                best[0] = T.float32("-inf")
                best[1] = T.float32(0)
                bi[0] = 1 << 30
                for e in T.unroll(8):
                    if val[e] > best[0]:
                        best[0] = val[e]
                        best[1] = sc[e]
                        bi[0] = lane * 8 + e
                for sh in T.unroll(5):
                    ov: T.float32 = T.tvm_warp_shuffle_xor(T.uint32(0xFFFFFFFF), best[0], 1 << sh, 32, 32)
                    os_: T.float32 = T.tvm_warp_shuffle_xor(T.uint32(0xFFFFFFFF), best[1], 1 << sh, 32, 32)
                    oi: T.int32 = T.tvm_warp_shuffle_xor(T.uint32(0xFFFFFFFF), bi[0], 1 << sh, 32, 32)
                    if ov > best[0] or (ov == best[0] and oi < bi[0]):
                        best[0] = ov
                        best[1] = os_
                        bi[0] = oi
                for e in T.unroll(8):
                    if bi[0] == lane * 8 + e:
                        val[e] = T.float32("-inf")
                ssum[0] = ssum[0] + T.Cast("float64", best[1])
                if lane == k:
                    mi[0] = bi[0]
                    mine[0] = best[1]
            if lane < TOP_K:
                IDX[t, lane] = mi[0]
                W[t, lane] = T.Cast("float32", T.Cast("float64", mine[0]) / ssum[0]) * T.float32(SCALE)

    return router


def _make_dispatch(scatter: bool, NLOC: int, OFF: int):
    """A CTA per local expert.  count: its number of pairs.  scatter: its row offset (segments padded to BM
    rows), the gathered row of each of its pairs in flat (token, choice) order (-1 for other ranks'
    experts, written by CTA 0), the token of each row (-1 on padding), the expert of each row block
    (-1 past the last segment)."""

    @T.prim_func
    def dispatch(i_h: T.handle, c_h: T.handle, r_h: T.handle, t_h: T.handle, tl_h: T.handle):
        n = T.int32()
        R = T.int32()
        NT = T.int32()
        IDS = T.match_buffer(i_h, (n,), "int32")
        CNT = T.match_buffer(c_h, (NLOC,), "int32")
        ROW = T.match_buffer(r_h, (n,), "int32")
        TOK = T.match_buffer(t_h, (R,), "int32")
        TILES = T.match_buffer(tl_h, (NT,), "int32")
        T.device_entry()
        e = T.cta_id([NLOC])
        tx = T.thread_id([256])
        sm = T.alloc_shared((258,), "int32")
        cnt = T.alloc_local((1,), "int32")
        run = T.alloc_local((2,), "int32")
        chunk: T.let = T.ceildiv(n, 256)
        lo: T.let = T.min(tx * chunk, n)
        hi: T.let = T.min(lo + chunk, n)
        cnt[0] = 0
        for i in T.serial(hi - lo):
            if IDS[lo + i] == e + OFF:
                cnt[0] = cnt[0] + 1
        sm[tx] = cnt[0]
        T.cuda.cta_sync()
        if tx == 0:                                  # exclusive scan of the 256 counts; the padded offset
            run[0] = 0
            for j in T.serial(256):
                run[1] = sm[j]
                sm[j] = run[0]
                run[0] = run[0] + run[1]
            sm[256] = run[0]
            run[1] = 0
            if scatter:
                for e2 in T.serial(e):
                    run[1] = run[1] + T.ceildiv(CNT[e2], BM) * BM
            sm[257] = run[1]
        T.cuda.cta_sync()
        if not scatter:
            if tx == 0:
                CNT[e] = sm[256]
        else:
            total: T.int32 = sm[256]
            off: T.int32 = sm[257]
            end: T.int32 = off + T.ceildiv(total, BM) * BM
            cnt[0] = off + sm[tx]
            for i in T.serial(hi - lo):
                v: T.int32 = IDS[lo + i]
                if v == e + OFF:
                    ROW[lo + i] = cnt[0]
                    TOK[cnt[0]] = (lo + i) // TOP_K
                    cnt[0] = cnt[0] + 1
                elif e == 0 and (v < OFF or v >= OFF + NLOC):
                    ROW[lo + i] = -1
            for j in T.serial(T.ceildiv(end - off - total - tx, 256)):
                TOK[off + total + tx + j * 256] = -1
            for j in T.serial(T.ceildiv(end // BM - off // BM - tx, 256)):
                TILES[off // BM + tx + j * 256] = e
            if e == NLOC - 1:                        # past the last segment: no rows, no tiles
                for j in T.serial(T.ceildiv(R - end - tx, 256)):
                    TOK[end + tx + j * 256] = -1
                for j in T.serial(T.ceildiv(NT - end // BM - tx, 256)):
                    TILES[end // BM + tx + j * 256] = -1

    return dispatch


def _make_gather(D: int):
    NV, KB = D // 16, D // BLOCK

    @T.prim_func
    def gather(x_h: T.handle, s_h: T.handle, t_h: T.handle, g_h: T.handle, gs_h: T.handle):
        ntok = T.int32()
        R = T.int32()
        X = T.match_buffer(x_h, (ntok, D), "uint8", align=16)
        XS = T.match_buffer(s_h, (KB, ntok), "float32")
        TOK = T.match_buffer(t_h, (R,), "int32")
        XG = T.match_buffer(g_h, (R, D), "uint8", align=16)
        SAG = T.match_buffer(gs_h, (R, KB), "float32")
        T.device_entry()
        row = T.cta_id([R])
        tx = T.thread_id([128])
        r = T.alloc_local((16,), "uint8")
        tok: T.int32 = TOK[row]
        if tok >= 0:
            for it in T.serial(T.ceildiv(NV - tx, 128)):
                v = T.meta_var(tx + it * 128)
                T.tile.copy(r[:], X[tok, v * 16:v * 16 + 16])
                T.tile.copy(XG[row, v * 16:v * 16 + 16], r[:])
            for it in T.serial(T.ceildiv(KB - tx, 128)):
                SAG[row, tx + it * 128] = XS[tx + it * 128, tok]

    return gather


def _make_decode():
    STRIDE = 132 * 16 * 256

    @T.prim_func
    def decode(w_h: T.handle, o_h: T.handle):
        NV = T.int32()
        W8 = T.match_buffer(w_h, (NV, 16), "uint8", align=16)
        O = T.match_buffer(o_h, (NV, 16), "bfloat16", align=16)
        T.device_entry()
        bx = T.cta_id([132 * 16])
        tx = T.thread_id([256])
        C8 = T.decl_buffer((NV, 16), "float8_e4m3fn", data=W8.data)      # the same bytes, as e4m3
        rin = T.alloc_local((16,), "float8_e4m3fn")
        rout = T.alloc_local((16,), "bfloat16")
        for it in T.serial(T.ceildiv(NV - bx * 256 - tx, STRIDE)):
            v = T.meta_var(bx * 256 + tx + it * STRIDE)
            T.tile.copy(rin[:], C8[v, 0:16])
            for i in T.unroll(16):
                rout[i] = T.Cast("bfloat16", T.Cast("float32", rin[i]))
            T.tile.copy(O[v, 0:16], rout[:])

    return decode


def _make_gemm1(NH: int, K: int):
    """act (R, NH) = silu(A Bg[e]^T) * (A Bu[e]^T), A e4m3 (R, K) with scales SA, B (E, 2 NH, K) e4m3 (up rows,
    then gate rows) with scales SB (E, 2 NH / 128, K / 128); e = TILES[row block]."""
    N, KB, BK = 2 * NH, K // BLOCK, BLOCK

    @T.prim_func
    def gemm1(a: T.handle, sa: T.handle, b: T.handle, sb: T.handle, tl: T.handle, c: T.handle):
        R = T.int32()
        G = T.int32()
        NT = T.int32()
        A = T.match_buffer(a, (R, K), "uint8", align=16)           # fp8 e4m3 bytes
        SA = T.match_buffer(sa, (R, KB), "float32")
        B = T.match_buffer(b, (G, N, K), "uint8", align=16)
        SB = T.match_buffer(sb, (G, N // BLOCK, KB), "float32")
        TILES = T.match_buffer(tl, (NT,), "int32")
        C = T.match_buffer(c, (R, NH), "bfloat16", align=16)
        A_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)
        T.call_packed("runtime.cuTensorMapEncodeTiled", A_map, "uint8", 2, A.data,
                      K, R, K, BK, BM, 1, 1, 0, SWIZZLE_128B, 0, 0)
        B_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)
        T.call_packed("runtime.cuTensorMapEncodeTiled", B_map, "uint8", 3, B.data,
                      K, N, G, K, N * K, BK, HALF, 1, 1, 1, 1, 0, SWIZZLE_128B, 0, 0)
        T.device_entry()
        bn, bm = T.cta_id([NH // HALF, T.ceildiv(R, BM)])
        tx = T.thread_id([128])
        A_s = T.alloc_buffer((BM, BK), "uint8", scope="shared", align=1024)
        B_s = T.alloc_buffer((2 * HALF, BK), "uint8", scope="shared", align=1024)
        bar = T.shared_scalar("uint64")
        phase = T.alloc_local((1,), "int32")
        acc = T.alloc_buffer((NACC,), "float32", scope="local")
        tmp = T.alloc_buffer((NACC,), "float32", scope="local")
        scl = T.alloc_local((4,), "float32")      # (up, gate) x (row r0, row r0 + 8)
        descA = T.alloc_local((1,), "uint64")
        descB = T.alloc_local((1,), "uint64")
        e: T.int32 = TILES[bm]
        if e >= 0:
            r0: T.let = bm * BM + (tx % 32) // 4 + (tx // 32) * 16
            if tx == 0:
                T.ptx.mbarrier.init.shared.b64(T.address_of(bar), T.uint32(1))
            T.ptx.fence.proxy.async_.shared__cta()
            T.cuda.cta_sync()
            phase[0] = 0
            for i in T.unroll(NACC):
                acc[i] = T.float32(0)
            for kt in T.serial(KB):
                if tx == 0:
                    T.ptx[TMA_2D](A_s.data, T.address_of(A_map), kt * BK, bm * BM, T.address_of(bar))
                    T.ptx[TMA_3D](B_s.data, T.address_of(B_map), kt * BK, bn * HALF, e, T.address_of(bar))
                    T.ptx[TMA_3D](B_s.ptr_to([HALF, 0]), T.address_of(B_map), kt * BK, NH + bn * HALF, e,
                                  T.address_of(bar))
                    T.ptx.mbarrier.arrive.expect_tx.shared.b64(T.address_of(bar), T.uint32((BM + 2 * HALF) * BK))
                sbu: T.float32 = SB[e, (bn * HALF) // BLOCK, kt]
                sbg: T.float32 = SB[e, (NH + bn * HALF) // BLOCK, kt]
                sa0: T.float32 = SA[r0, kt]
                sa1: T.float32 = SA[r0 + 8, kt]
                scl[0] = sa0 * sbu
                scl[1] = sa1 * sbu
                scl[2] = sa0 * sbg
                scl[3] = sa1 * sbg
                for i in T.unroll(NACC):
                    tmp[i] = T.float32(0)
                T.cuda.mbarrier_wait(T.address_of(bar), phase[0])
                phase[0] = phase[0] ^ 1
                for i in T.unroll(NACC):
                    T.cuda.wgmma.noop_barrier(tmp[i])
                T.ptx.wgmma.fence.sync.aligned()
                for kk in T.unroll(BK // 32):      # 32 fp8 = 32 bytes per k32 step inside the swizzled row
                    T.cuda.wgmma.encode_matrix_descriptor(T.address_of(descA[0]), A_s.ptr_to([0, kk * 32]), 1, 64,
                                                          SWIZZLE_128B)
                    T.cuda.wgmma.encode_matrix_descriptor(T.address_of(descB[0]), B_s.ptr_to([0, kk * 32]), 1, 64,
                                                          SWIZZLE_128B)
                    T.ptx[WGMMA_F8](*[tmp[i] for i in range(NACC)], descA[0], descB[0], T.bool(True), 1, 1)
                T.ptx.wgmma.commit_group.sync.aligned()
                T.ptx.wgmma.wait_group.sync.aligned(0)
                for i in T.unroll(NACC):
                    T.cuda.wgmma.noop_barrier(tmp[i])
                T.cuda.cta_sync()              # smem is reused by the next TMA load
                for i in T.unroll(NACC // 4):  # fragment element (i, h, j): row r0 + 8h, col 8i + 2(tx%4) + j
                    for h in T.unroll(2):
                        for j in T.unroll(2):
                            acc[i * 4 + h * 2 + j] = acc[i * 4 + h * 2 + j] + tmp[i * 4 + h * 2 + j] * scl[(i // 8) * 2 + h]
            for i in T.unroll(NACC // 8):      # fragment columns 8i.. are up, 8(i+8).. the matching gate values
                for h in T.unroll(2):
                    for j in T.unroll(2):
                        row = T.meta_var(r0 + h * 8)
                        col = T.meta_var(bn * HALF + i * 8 + (tx % 4) * 2 + j)
                        g = T.meta_var(T.Cast("float64", acc[(i + 8) * 4 + h * 2 + j]))
                        silu = T.meta_var(T.Cast("float32", g / (T.float64(1) + T.exp(-g))))
                        C[row, col] = T.Cast("bfloat16", silu * acc[i * 4 + h * 2 + j])

    return gemm1


def _make_gemm2(N: int, K: int):
    """y (R, N) = A B[e]^T in fp32, A bf16 (R, K), B (E, N, K) bf16 codes with 128x128 block scales SB
    (E, N / 128, K / 128), each 64-wide K tile promoted with its block scale; e = TILES[row block]."""
    BK, BN = 64, 128

    @T.prim_func
    def gemm2(a: T.handle, b: T.handle, sb: T.handle, tl: T.handle, c: T.handle):
        R = T.int32()
        G = T.int32()
        NT = T.int32()
        A = T.match_buffer(a, (R, K), "bfloat16", align=16)
        B = T.match_buffer(b, (G, N, K), "bfloat16", align=16)
        SB = T.match_buffer(sb, (G, N // BLOCK, K // BLOCK), "float32")
        TILES = T.match_buffer(tl, (NT,), "int32")
        C = T.match_buffer(c, (R, N), "float32", align=16)
        A_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)
        T.call_packed("runtime.cuTensorMapEncodeTiled", A_map, "bfloat16", 2, A.data,
                      K, R, K * 2, BK, BM, 1, 1, 0, SWIZZLE_128B, 0, 0)
        B_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)
        T.call_packed("runtime.cuTensorMapEncodeTiled", B_map, "bfloat16", 3, B.data,
                      K, N, G, K * 2, N * K * 2, BK, BN, 1, 1, 1, 1, 0, SWIZZLE_128B, 0, 0)
        T.device_entry()
        bn, bm = T.cta_id([N // BN, T.ceildiv(R, BM)])
        tx = T.thread_id([128])
        A_s = T.alloc_buffer((BM, BK), "bfloat16", scope="shared", align=1024)
        B_s = T.alloc_buffer((BN, BK), "bfloat16", scope="shared", align=1024)
        bar = T.shared_scalar("uint64")
        phase = T.alloc_local((1,), "int32")
        acc = T.alloc_buffer((NACC,), "float32", scope="local")
        tmp = T.alloc_buffer((NACC,), "float32", scope="local")
        descA = T.alloc_local((1,), "uint64")
        descB = T.alloc_local((1,), "uint64")
        e: T.int32 = TILES[bm]
        if e >= 0:
            r0: T.let = bm * BM + (tx % 32) // 4 + (tx // 32) * 16
            if tx == 0:
                T.ptx.mbarrier.init.shared.b64(T.address_of(bar), T.uint32(1))
            T.ptx.fence.proxy.async_.shared__cta()
            T.cuda.cta_sync()
            phase[0] = 0
            for i in T.unroll(NACC):
                acc[i] = T.float32(0)
            for kt in T.serial(K // BK):
                if tx == 0:
                    T.ptx[TMA_2D](A_s.data, T.address_of(A_map), kt * BK, bm * BM, T.address_of(bar))
                    T.ptx[TMA_3D](B_s.data, T.address_of(B_map), kt * BK, bn * BN, e, T.address_of(bar))
                    T.ptx.mbarrier.arrive.expect_tx.shared.b64(T.address_of(bar), T.uint32((BM + BN) * BK * 2))
                sc: T.float32 = SB[e, bn, kt // 2]   # BN = one scale block; two K tiles per scale block
                for i in T.unroll(NACC):
                    tmp[i] = T.float32(0)
                T.cuda.mbarrier_wait(T.address_of(bar), phase[0])
                phase[0] = phase[0] ^ 1
                for i in T.unroll(NACC):
                    T.cuda.wgmma.noop_barrier(tmp[i])
                T.ptx.wgmma.fence.sync.aligned()
                for kk in T.unroll(BK // 16):      # k16 step = 32 bytes inside the swizzled row
                    T.cuda.wgmma.encode_matrix_descriptor(T.address_of(descA[0]), A_s.ptr_to([0, kk * 16]), 1, 64,
                                                          SWIZZLE_128B)
                    T.cuda.wgmma.encode_matrix_descriptor(T.address_of(descB[0]), B_s.ptr_to([0, kk * 16]), 1, 64,
                                                          SWIZZLE_128B)
                    T.ptx[WGMMA_BF](*[tmp[i] for i in range(NACC)], descA[0], descB[0], T.bool(True), 1, 1, 0, 0)
                T.ptx.wgmma.commit_group.sync.aligned()
                T.ptx.wgmma.wait_group.sync.aligned(0)
                for i in T.unroll(NACC):
                    T.cuda.wgmma.noop_barrier(tmp[i])
                T.cuda.cta_sync()              # smem is reused by the next TMA load
                for i in T.unroll(NACC):
                    acc[i] = acc[i] + tmp[i] * sc
            for i in T.unroll(NACC // 4):
                for h in T.unroll(2):
                    for j in T.unroll(2):
                        C[r0 + h * 8, bn * BN + i * 8 + (tx % 4) * 2 + j] = acc[i * 4 + h * 2 + j]

    return gemm2


def _make_combine(D: int):
    NV = D // 4

    @T.prim_func
    def combine(y_h: T.handle, r_h: T.handle, w_h: T.handle, o_h: T.handle):
        ntok = T.int32()
        R = T.int32()
        n = T.int32()
        Y = T.match_buffer(y_h, (R, D), "float32", align=16)
        ROW = T.match_buffer(r_h, (n,), "int32")
        W = T.match_buffer(w_h, (ntok, TOP_K), "float32")
        O = T.match_buffer(o_h, (ntok, D), "bfloat16", align=16)
        T.device_entry()
        t = T.cta_id([ntok])
        tx = T.thread_id([128])
        rows = T.alloc_local((TOP_K,), "int32")
        ws = T.alloc_local((TOP_K,), "float32")
        r = T.alloc_local((4,), "float32")
        o = T.alloc_local((4,), "bfloat16")
        acc = T.alloc_local((4,), "float32")
        for j in T.unroll(TOP_K):
            rows[j] = ROW[t * TOP_K + j]
            ws[j] = W[t, j]
        for it in T.serial(T.ceildiv(NV - tx, 128)):
            v = T.meta_var(tx + it * 128)
            for i in T.unroll(4):
                acc[i] = T.float32(0)
            for j in T.unroll(TOP_K):
                if rows[j] >= 0:
                    T.tile.copy(r[:], Y[rows[j], v * 4:v * 4 + 4])
                    for i in T.unroll(4):
                        acc[i] = acc[i] + ws[j] * r[i]
            for i in T.unroll(4):
                o[i] = T.Cast("bfloat16", acc[i])
            T.tile.copy(O[t, v * 4:v * 4 + 4], o[:])

    return combine


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _build(func, arch):
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    with target:
        return tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")


def _prepare(routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale,
             gemm2_weights, gemm2_weights_scale, local_expert_offset=32, routed_scaling_factor=2.5, arch=None):
    experts = routing_logits.shape[1]
    nloc, n1, d = gemm1_weights.shape
    f = n1 // 2
    assert d % BLOCK == 0 and f % BLOCK == 0 and experts == 256
    key = (experts, nloc, d, f, int(local_expert_offset), float(routed_scaling_factor))
    if key not in _COMPILED:
        a = arch or _arch()
        _COMPILED[key] = tuple(_build(fn, a) for fn in (
            _make_router(experts, float(routed_scaling_factor)),
            _make_dispatch(False, nloc, int(local_expert_offset)), _make_dispatch(True, nloc, int(local_expert_offset)),
            _make_gather(d), _make_decode(), _make_gemm1(f, d), _make_gemm2(d, f), _make_combine(d)))
    return list(_COMPILED[key])


def solve(routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale,
          gemm2_weights, gemm2_weights_scale, local_expert_offset, routed_scaling_factor):
    router, count, scatter, gather, decode, gemm1, gemm2, combine = _prepare(
        routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale,
        gemm2_weights, gemm2_weights_scale, local_expert_offset, routed_scaling_factor)
    tokens, d = hidden_states.shape
    nloc, n1, _ = gemm1_weights.shape
    f = n1 // 2
    dev, i32 = hidden_states.device, torch.int32
    rows = -(-(tokens * TOP_K + nloc * (BM - 1)) // BM) * BM     # every pair local + every segment's padding
    ids = torch.empty(tokens, TOP_K, dtype=i32, device=dev)
    w = torch.empty(tokens, TOP_K, dtype=torch.float32, device=dev)
    counts = torch.empty(nloc, dtype=i32, device=dev)
    row_of = torch.empty(tokens * TOP_K, dtype=i32, device=dev)
    tok_of = torch.empty(rows, dtype=i32, device=dev)
    tiles = torch.empty(rows // BM, dtype=i32, device=dev)
    xg = torch.empty(rows, d, dtype=torch.uint8, device=dev)
    sag = torch.empty(rows, d // BLOCK, dtype=torch.float32, device=dev)
    w2 = torch.empty(nloc, d, f, dtype=torch.bfloat16, device=dev)
    act = torch.empty(rows, f, dtype=torch.bfloat16, device=dev)
    y = torch.empty(rows, d, dtype=torch.float32, device=dev)
    out = torch.empty(tokens, d, dtype=torch.bfloat16, device=dev)
    router(routing_logits.contiguous(), routing_bias.contiguous(), ids, w)
    flat = ids.view(-1)
    count(flat, counts, row_of, tok_of, tiles)
    scatter(flat, counts, row_of, tok_of, tiles)
    gather(hidden_states.contiguous().view(torch.uint8), hidden_states_scale.contiguous(), tok_of, xg, sag)
    decode(gemm2_weights.contiguous().view(torch.uint8).view(-1, 16), w2.view(-1, 16))
    gemm1(xg, sag, gemm1_weights.contiguous().view(torch.uint8), gemm1_weights_scale.contiguous(), tiles, act)
    gemm2(act, w2, gemm2_weights_scale.contiguous(), tiles, y)
    combine(y, row_of, w, out)
    return out
