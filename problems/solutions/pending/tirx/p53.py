"""p53 FP8 block-scaled gate/up projections + SiLU gating (3584 -> 2 x 18944) in TIRx, relayout in the DSL too.

Kernel 1 (relayout, two launches): the problem gives the gate and up weights K-major ([3584, 18944] e4m3
each); FP8 WGMMA reads both operands K-major only, so each 128x128 block is transposed through shared
memory (16-byte coalesced loads of 128 K rows, byte gathers down the columns, 16-byte stores) into one
N-major [2 x 18944, 3584] code matrix that interleaves 64-row groups: rows 128t .. 128t + 63 are gate
outputs 64t .. 64t + 63 and rows 128t + 64 .. 128t + 127 the up outputs of the same columns (the up launch
writes through a view offset by 64 rows).  Codes are moved as bytes: bit for bit.  The 128x128 scales are
read in place ([28, 148] each): B-row tile t uses column t // 2 of the gate and of the up scales.
Kernel 2 (fp8_gemm_swiglu): a persistent, warp-specialised GEMM over 128 x 128 tiles (128 tokens x 64
outputs, gate and up) in grouped order (16 row tiles walk the column tiles together, so A and B bands are
reused in L2): thread 0 issues the TMA loads (uint8 view, 128B swizzle) of A and B into a 6-stage ring in
dynamic shared memory (full / empty mbarriers) and runs ahead across tiles; two consumer warpgroups (64
rows each, setmaxnreg 232 / 40) issue four WGMMA m64n128k32 e4m3 x e4m3 -> fp32 per 128-wide K block into
a scratch fragment (the first with scale-d off: nothing is zeroed), wait, free the stage (one arrive per warp),
and promote it into the fp32 accumulator with x_scale[row, kb] * w_scale (gate or up block; the shipped kernel's
arithmetic and order). Against the shipped kernel: no 64-register zeroing after the stage wait, descriptors
encoded once and stepped by 32-bit adds, stage/phase counters, the next K block's scales loaded a block early
(consumer loop 240 -> 152 SASS instructions per K block).
Epilogue: silu(gate) * up in fp32 on the thread's own gate/up pairs (fragment columns c and c + 64), one
rounding to bf16, stored as bf16 pairs (4-byte stores).  torch only allocates.
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


BLOCK = 128
BM, BN, BK = 128, 128, 128         # output tile per CTA; BK = one 128-byte swizzle row of fp8 = one scale block
STAGES = 6                         # 6 x 32 KB of A + B tiles in dynamic shared memory
GROUP = 16                         # row tiles per raster group
HALF = 64                          # outputs per tile: 64 gate rows + 64 up rows of B
NACC = 64 * BN // 128              # accumulator floats per thread (m64n128 per consumer warpgroup)
CONSUMER_WARPS = 8
H200_SMS = 132                     # multiprocessors of the target when compiling without a GPU
WGMMA = "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3"
TMA_LOAD = "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
SWIZZLE_128B = 3
STAGE_A = BM * BK                  # bytes of one stage's A tile (B tile: STAGE_B); descriptor steps are 16 bytes
STAGE_B = BN * BK


def _make_gemm(sms: int):
    """The persistent warp-specialised FP8 GEMM + SwiGLU for a GPU with sms multiprocessors."""

    @T.prim_func
    def fp8_gemm_swiglu(a: T.handle, sa: T.handle, b: T.handle, sg: T.handle, su: T.handle, c: T.handle):
        M = T.int32()
        I = T.int32()
        K = T.int32()
        KB = T.int32()
        NB = T.int32()
        A = T.match_buffer(a, (M, K), "uint8", align=16)          # fp8 e4m3 bytes
        SA = T.match_buffer(sa, (M, KB), "float32")
        B = T.match_buffer(b, (2 * I, K), "uint8", align=16)      # 64 gate rows, 64 up rows, 64 gate rows, ..
        SG = T.match_buffer(sg, (KB, NB), "float32")              # the problem's scales, read in place
        SU = T.match_buffer(su, (KB, NB), "float32")
        C = T.match_buffer(c, (M, I), "bfloat16", align=16)
        A_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)
        T.call_packed("runtime.cuTensorMapEncodeTiled", A_map, "uint8", 2, A.data,
                      K, M, K, BK, BM, 1, 1, 0, SWIZZLE_128B, 0, 0)
        B_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)
        T.call_packed("runtime.cuTensorMapEncodeTiled", B_map, "uint8", 2, B.data,
                      K, 2 * I, K, BK, BN, 1, 1, 0, SWIZZLE_128B, 0, 0)
        T.device_entry()
        MT = T.meta_var(T.ceildiv(M, BM))
        NT = T.meta_var(2 * I // BN)
        KT = T.meta_var(T.ceildiv(K, BK))
        GRID = T.meta_var(T.min(MT * NT, sms))
        bx = T.cta_id([T.min(MT * NT, sms)])
        tx = T.thread_id([384])
        pool = T.SMEMPool()
        A_s = pool.alloc((STAGES, BM, BK), "uint8", align=1024)
        B_s = pool.alloc((STAGES, BN, BK), "uint8", align=1024)
        bars = pool.alloc((2 * STAGES,), "uint64", align=8)        # full[s], then empty[s]
        pool.commit()
        tile = T.alloc_local((2,), "int32")                          # (m tile, n tile) of the current tile
        acc = T.alloc_buffer((NACC,), "float32", scope="local")
        tmp = T.alloc_buffer((NACC,), "float32", scope="local")
        scl = T.alloc_local((4,), "float32")                         # (gate, up) x (row r0, row r0 + 8)
        nxt = T.alloc_local((4,), "float32")                         # next K block's x scales (2 rows), gate, up
        roff = T.alloc_local((2,), "int32")                          # flat offsets of the two rows' x scales
        ring = T.alloc_local((2,), "int32")                          # (stage, phase) of the consumers' ring walk
        descA = T.alloc_local((1,), "uint64")
        descB = T.alloc_local((1,), "uint64")
        SAf = T.decl_buffer((M * KB,), "float32", data=SA.data)
        C32 = T.decl_buffer((M, I // 2), "uint32", data=C.data)    # bf16 pairs (I is a multiple of 128)
        if tx == 0:
            for s in T.unroll(STAGES):
                T.ptx.mbarrier.init.shared.b64(bars.ptr_to([s]), T.uint32(1))
                T.ptx.mbarrier.init.shared.b64(bars.ptr_to([STAGES + s]), T.uint32(CONSUMER_WARPS))
        T.ptx.fence.proxy.async_.shared__cta()
        T.cuda.cta_sync()
        if tx < 128:                                                  # producer warpgroup
            T.ptx.setmaxnreg.dec.sync.aligned.u32(40)
            if tx == 0:
                for i in T.serial(T.ceildiv(MT * NT - bx, GRID)):
                    _tile_coords(tile, bx + i * GRID, MT, NT)
                    for kt in T.serial(KT):
                        it = T.meta_var(i * KT + kt)
                        T.cuda.mbarrier_wait(bars.ptr_to([STAGES + it % STAGES]), ((it // STAGES) & 1) ^ 1)
                        T.ptx.mbarrier.arrive.expect_tx.shared.b64(bars.ptr_to([it % STAGES]),
                                                                   T.uint32((BM + BN) * BK))
                        T.ptx[TMA_LOAD](A_s.ptr_to([it % STAGES, 0, 0]), T.address_of(A_map), kt * BK,
                                        tile[0] * BM, bars.ptr_to([it % STAGES]))
                        T.ptx[TMA_LOAD](B_s.ptr_to([it % STAGES, 0, 0]), T.address_of(B_map), kt * BK,
                                        tile[1] * BN, bars.ptr_to([it % STAGES]))
        else:                                                         # two consumer warpgroups, 64 rows each
            T.ptx.setmaxnreg.inc.sync.aligned.u32(232)
            wg = T.meta_var((tx - 128) // 128)
            lt = T.meta_var(tx % 128)
            # Descriptors of stage 0, k step 0, encoded once: stage s, k step kk lie s * STAGE_BYTES + 32 kk bytes
            # further, which adds (s * STAGE_BYTES + 32 kk) / 16 to the start-address field (no carry: < 2^14).
            T.cuda.wgmma.encode_matrix_descriptor(T.address_of(descA[0]), A_s.ptr_to([0, wg * 64, 0]),
                                                  1, 64, SWIZZLE_128B)
            T.cuda.wgmma.encode_matrix_descriptor(T.address_of(descB[0]), B_s.ptr_to([0, 0, 0]),
                                                  1, 64, SWIZZLE_128B)
            ring[0] = 0
            ring[1] = 0
            for i in T.serial(T.ceildiv(MT * NT - bx, GRID)):
                _tile_coords(tile, bx + i * GRID, MT, NT)
                r0 = T.meta_var(tile[0] * BM + wg * 64 + (lt % 32) // 4 + (lt // 32) * 16)
                roff[0] = T.min(r0, M - 1) * KB
                roff[1] = T.min(r0 + 8, M - 1) * KB
                nxt[0] = SAf[roff[0]]
                nxt[1] = SAf[roff[1]]
                nxt[2] = SG[0, tile[1] // 2]
                nxt[3] = SU[0, tile[1] // 2]
                for e in T.unroll(NACC):
                    acc[e] = T.float32(0)
                for kt in T.serial(KT):
                    scl[0] = nxt[0] * nxt[2]
                    scl[1] = nxt[1] * nxt[2]
                    scl[2] = nxt[0] * nxt[3]
                    scl[3] = nxt[1] * nxt[3]
                    kn = T.meta_var(T.min(kt + 1, KT - 1))              # the next K block's scales, a block early
                    nxt[0] = SAf[roff[0] + kn]
                    nxt[1] = SAf[roff[1] + kn]
                    nxt[2] = SG[kn, tile[1] // 2]
                    nxt[3] = SU[kn, tile[1] // 2]
                    T.cuda.mbarrier_wait(bars.ptr_to([ring[0]]), ring[1])
                    T.ptx.wgmma.fence.sync.aligned()
                    for kk in T.unroll(BK // 32):  # 32 fp8 = 32 bytes per k32 step inside the swizzled row
                        T.ptx[WGMMA](*[tmp[e] for e in range(NACC)],
                                     _desc_step(descA[0], ring[0] * (STAGE_A // 16) + kk * 2),
                                     _desc_step(descB[0], ring[0] * (STAGE_B // 16) + kk * 2),
                                     kk > 0, 1, 1)                    # k step 0 overwrites: no zeroing
                    T.ptx.wgmma.commit_group.sync.aligned()
                    T.ptx.wgmma.wait_group.sync.aligned(0)
                    for e in T.unroll(NACC):
                        T.cuda.wgmma.noop_barrier(tmp[e])
                    if lt % 32 == 0:                                  # one arrive per warp frees the stage
                        T.ptx.mbarrier.arrive.shared.b64(bars.ptr_to([STAGES + ring[0]]))
                    for q in T.unroll(NACC // 4):  # element (q, h, j): row r0 + 8h, col 8q + 2(lt % 4) + j
                        for h in T.unroll(2):
                            for j in T.unroll(2):
                                acc[q * 4 + h * 2 + j] = acc[q * 4 + h * 2 + j] + \
                                    tmp[q * 4 + h * 2 + j] * scl[(q // 8) * 2 + h]
                    if ring[0] == STAGES - 1:
                        ring[0] = 0
                        ring[1] = ring[1] ^ 1
                    else:
                        ring[0] = ring[0] + 1
                for h in T.unroll(2):  # fragment columns 8q.. are gate, 8(q+8).. the matching up values
                    row = T.meta_var(r0 + h * 8)
                    if row < M:
                        for q in T.unroll(NACC // 8):
                            cp = T.meta_var(tile[1] * (HALF // 2) + q * 4 + lt % 4)   # column pair (col // 2)
                            C32[row, cp] = _bf16_pair(_swiglu(acc[q * 4 + h * 2], acc[(q + 8) * 4 + h * 2]),
                                                      _swiglu(acc[q * 4 + h * 2 + 1], acc[(q + 8) * 4 + h * 2 + 1]))

    return fp8_gemm_swiglu


def _swiglu(g, u):
    """silu(g) * u in fp32, as the shipped epilogue computes it."""
    return g / (T.float32(1) + T.exp(-g)) * u


def _desc_step(desc, units):
    """desc with units (16-byte steps) added to its start-address field: a 32-bit add on the low word (the field
    stays under 2^14, so nothing carries out of it) and the high word (offsets, layout) kept as encoded."""
    return T.bitwise_or(T.shift_left(T.shift_right(desc, T.uint64(32)), T.uint64(32)),
                        T.Cast("uint64", T.Cast("uint32", desc) + T.Cast("uint32", units)))


def _bf16_pair(lo, hi):
    """Two fp32 values rounded to bf16 and packed as one uint32 (lo in the low half: little-endian order)."""
    return T.bitwise_or(T.Cast("uint32", T.reinterpret("uint16", T.Cast("bfloat16", lo))),
                        T.shift_left(T.Cast("uint32", T.reinterpret("uint16", T.Cast("bfloat16", hi))), T.uint32(16)))


@T.inline
def _tile_coords(tile, t, MT, NT):
    """tile = (m tile, n tile) of tile number t in grouped order: GROUP row tiles walk the column tiles
    together, so the CTAs resident at once share GROUP row bands of A and a few column bands of B in L2."""
    g = T.meta_var(t // (GROUP * NT))
    gm = T.meta_var(T.min(MT - g * GROUP, GROUP))
    tile[0] = g * GROUP + (t - g * GROUP * NT) % gm
    tile[1] = (t - g * GROUP * NT) // gm


THREADS = 256
ROW_PAD = 144                      # shared-memory row stride of a staged block (16-byte rows)
CHUNKS = BLOCK * BLOCK // 16 // THREADS   # 16-byte chunks per thread and phase


@T.prim_func
def relayout(s_h: T.handle, d_h: T.handle):
    """D[256 nb + 128 (n // 64) + n % 64, k] = S[k, 128 nb + n] (codes as bytes): one CTA per 128x128 block."""
    KB = T.int32()
    NB = T.int32()
    R = T.int32()
    S = T.match_buffer(s_h, (KB, BLOCK, NB, BLOCK), "uint8", align=16)   # [K, N] viewed in 128x128 blocks
    D = T.match_buffer(d_h, (R, KB * BLOCK), "uint8", align=16)          # R = 2N - 64 rows
    T.device_entry()
    kb, nb = T.cta_id([KB, NB])
    tx = T.thread_id([THREADS])
    tile = T.alloc_buffer((BLOCK, ROW_PAD), "uint8", scope="shared", align=16)
    r = T.alloc_local((16,), "uint8")
    o = T.alloc_local((16,), "uint8")
    for i in T.unroll(CHUNKS):         # chunk i * 256 + tx: K row i * 32 + tx // 8, N bytes (tx % 8) * 16 ..
        T.tile.copy(r[:], S[kb, i * 32 + tx // 8, nb, (tx % 8) * 16:(tx % 8) * 16 + 16])
        T.tile.copy(tile[i * 32 + tx // 8, (tx % 8) * 16:(tx % 8) * 16 + 16], r[:])
    T.cuda.cta_sync()
    for i in T.unroll(CHUNKS):         # chunk i * 256 + tx: N row tx % 128, K bytes (2i + tx // 128) * 16 ..
        for e in T.unroll(16):
            o[e] = tile[(2 * i + tx // 128) * 16 + e, tx % 128]
        drow = T.meta_var(nb * 2 * BLOCK + (tx % 128) // HALF * BLOCK + tx % HALF)
        T.tile.copy(D[drow, kb * BLOCK + (2 * i + tx // 128) * 16:kb * BLOCK + (2 * i + tx // 128) * 16 + 16], o[:])


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _build(func, arch):
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    with target:
        return tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")


def _prepare(qx, scale_x, qw_gate, scale_gate, qw_up, scale_up, arch=None):
    k, inter = qw_gate.shape
    assert qx.shape[1] == k and qw_up.shape == (k, inter), (qx.shape, qw_gate.shape, qw_up.shape)
    assert k % BK == 0 and inter % BLOCK == 0, (k, inter)
    if "gemm" not in _COMPILED:
        sms = H200_SMS if arch else torch.cuda.get_device_properties(0).multi_processor_count
        _COMPILED["gemm"] = (_build(relayout, arch or _arch()), _build(_make_gemm(sms), arch or _arch()))
    return list(_COMPILED["gemm"])


def solve(qx, scale_x, qw_gate, scale_gate, qw_up, scale_up):
    relayout_exe, gemm = _prepare(qx, scale_x, qw_gate, scale_gate, qw_up, scale_up)
    (tokens, k), inter, dev = qx.shape, qw_gate.shape[1], qx.device
    w = torch.empty(2 * inter, k, dtype=torch.uint8, device=dev)      # gate/up codes, N-major, 64-row interleave
    blocks = (k // BLOCK, BLOCK, inter // BLOCK, BLOCK)                 # a view: 128x128 blocks of [K, N]
    relayout_exe(qw_gate.view(torch.uint8).view(blocks), w[:2 * inter - HALF])
    relayout_exe(qw_up.view(torch.uint8).view(blocks), w[HALF:])
    out = torch.empty(tokens, inter, dtype=torch.bfloat16, device=dev)
    gemm(qx.view(torch.uint8), scale_x, w, scale_gate, scale_up, out)
    return out
