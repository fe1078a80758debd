"""p20 DeepSeek MLA prologue (q projection, NeoX RoPE on q and k_pe, compressed paged-cache write) in TIRx.

One launch. A tile is 128 tokens x 192 columns of q = q_c @ q_b_weight^T, i.e. one head's nope 128 +
rope 64 columns for 128 tokens (16 heads x 16 token tiles = 256 tiles); a persistent grid of one CTA per
SM walks tiles bx, bx + grid, ... (two each on 132 SMs, heads fastest), so the producer loads the next
tile's first k-tiles during the epilogue of the current one. 384 threads, warp-specialised:

* warpgroup 0 (setmaxnreg 40): thread 0 streams the k-tiles by TMA (q_c read in place from qkv_lora, the
  tensor map's row stride 2112 elements; 128B swizzle) into a 5-stage ring of 40 KiB stages with full /
  empty mbarriers;
* warpgroups 1 and 2 (setmaxnreg 232), 64 rows each: bf16 WGMMA m64n192k16 with fp32 accumulation (four
  per 64-wide k-tile), one batch left in flight (wait_group(1)) and the stage released a k-tile late.
  A 128 x 192 tile moves 13 KB of operands per MFLOP through L2 against the shipped 64 x 128 tile's 23.
  The ring's stage and parity run on the CTA's global k-tile count (tile i, k-tile kt: i * 24 + kt); a
  tile's last stage is released after its final wait_group(0).
* Epilogue: q rounded to bf16 as the reference's GEMM output; in the m64n192 fragment a thread holds
  columns 8q + 2(lane % 4) + j, so rope column 128 + x (q = 16..19) and its NeoX partner 160 + x (q =
  20..23) sit in the same thread: the rotation is done in registers, each product and sum rounded to bf16
  as torch's bf16 arithmetic does (products of two bf16 numbers are exact in fp32, so fast math changes
  nothing). cos/sin of the thread's two rows are loaded before the main loop.
* Cache: before each tile's main loop (while the producer fills the ring) each of the 8 consumer warps takes
  one token (tile b handles tokens 8b .. 8b + 7): for a valid slot it copies kv_c (512 bf16, 16-byte vectors)
  and writes the rotated k_pe into cache row slot of the flat [blocks * 16, 576] view; -1 writes nothing.

Numerics are those of the shipped two-kernel solution (same k16 WGMMA accumulation along K, same bf16
rounding steps). solve() does one torch.empty and the launch; the buffers are declared over the tensors
as they come (q as [tokens, 16, 192], the cache 4-D, flattened inside).
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
HD = NOPE + ROPE                   # 192: one head = one n-tile
ROW = KV_RANK + ROPE               # 576: one cache row
BM, BN, BK = 128, HD, 64           # BK = 64 bf16 = one 128-byte swizzle row
STAGES = 5                         # 5 x 40 KiB of A + B tiles in dynamic shared memory
NACC = 64 * BN // 128              # 96 accumulator floats per thread (m64n192 per consumer warpgroup)
CONSUMER_WARPS = 8
TOK_PER_CTA = CONSUMER_WARPS       # cache rows written per CTA, one per consumer warp
VEC = 8                            # bf16 per 16-byte access
WGMMA = "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16"
TMA_LOAD = "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
SWIZZLE_128B = 3
H200_SMS = 132                     # multiprocessors of the target when compiling without a GPU


def _bf(x):
    """x rounded to bf16 and back (the reference's bf16 arithmetic, round to nearest even)."""
    return T.Cast("float32", T.Cast("bfloat16", x))


def _make(block_size: int, sms: int):
    @T.prim_func
    def mla_prologue(x_h: T.handle, w_h: T.handle, p_h: T.handle, cs_h: T.handle, s_h: T.handle, c_h: T.handle,
                     q_h: T.handle):
        M = T.int32()
        npos = T.int32()
        nblk = T.int32()
        X = T.match_buffer(x_h, (M, WIDTH), "bfloat16", align=16)
        W = T.match_buffer(w_h, (HEADS * HD, Q_RANK), "bfloat16", align=16)
        POS = T.match_buffer(p_h, (M,), "int64")
        CS = T.match_buffer(cs_h, (npos, ROPE), "bfloat16")
        SLOT = T.match_buffer(s_h, (M,), "int64")
        C4 = T.match_buffer(c_h, (nblk, block_size, 1, ROW), "bfloat16", align=16)
        Q = T.match_buffer(q_h, (M, HEADS, HD), "bfloat16", align=16)
        A_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)
        T.call_packed("runtime.cuTensorMapEncodeTiled", A_map, "bfloat16", 2, X.data,
                      Q_RANK, M, WIDTH * 2, BK, BM, 1, 1, 0, SWIZZLE_128B, 0, 0)
        B_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)
        T.call_packed("runtime.cuTensorMapEncodeTiled", B_map, "bfloat16", 2, W.data,
                      Q_RANK, HEADS * HD, Q_RANK * 2, BK, BN, 1, 1, 0, SWIZZLE_128B, 0, 0)
        T.device_entry()
        TILES = T.meta_var(HEADS * T.ceildiv(M, BM))
        GRID = T.meta_var(T.min(TILES, sms))
        bx = T.cta_id([T.min(HEADS * T.ceildiv(M, BM), sms)])
        tx = T.thread_id([384])
        pool = T.SMEMPool()
        A_s = pool.alloc((STAGES, BM, BK), "bfloat16", align=1024)
        B_s = pool.alloc((STAGES, BN, BK), "bfloat16", align=1024)
        bars = pool.alloc((2 * STAGES,), "uint64", align=8)        # full[s], then empty[s]
        pool.commit()
        C = T.decl_buffer((nblk * block_size, ROW), "bfloat16", data=C4.data)
        acc = T.alloc_buffer((NACC,), "float32", scope="local")
        cs = T.alloc_local((32,), "float32")
        rv = T.alloc_local((2 * VEC,), "bfloat16")
        v = T.alloc_local((4,), "float32")
        ps = T.alloc_local((2,), "int32")
        tile = T.alloc_local((2,), "int32")                          # (token tile, head) of the current tile
        descA = T.alloc_local((1,), "uint64")
        descB = T.alloc_local((1,), "uint64")
        KT = T.meta_var(Q_RANK // BK)
        NTILE = T.meta_var(T.ceildiv(TILES - bx, GRID))        # this CTA's tiles: bx, bx + GRID, ...
        if tx == 0:
            for s in T.unroll(STAGES):
                T.ptx.mbarrier.init.shared.b64(bars.ptr_to([s]), T.uint32(1))
                T.ptx.mbarrier.init.shared.b64(bars.ptr_to([STAGES + s]), T.uint32(CONSUMER_WARPS))
        T.ptx.fence.proxy.async_.shared__cta()
        T.cuda.cta_sync()
        if tx < 128:                                                  # producer warpgroup
            T.ptx.setmaxnreg.dec.sync.aligned.u32(40)
            if tx == 0:                                               # runs ahead across tiles
                for i in T.serial(NTILE):
                    for kt in T.serial(KT):
                        it = T.meta_var(i * KT + kt)
                        t = T.meta_var(bx + i * GRID)
                        T.cuda.mbarrier_wait(bars.ptr_to([STAGES + it % STAGES]), ((it // STAGES) & 1) ^ 1)
                        T.ptx.mbarrier.arrive.expect_tx.shared.b64(bars.ptr_to([it % STAGES]),
                                                                   T.uint32((BM + BN) * BK * 2))
                        T.ptx[TMA_LOAD](A_s.ptr_to([it % STAGES, 0, 0]), T.address_of(A_map), kt * BK,
                                        (t // HEADS) * BM, bars.ptr_to([it % STAGES]))
                        T.ptx[TMA_LOAD](B_s.ptr_to([it % STAGES, 0, 0]), T.address_of(B_map), kt * BK,
                                        (t % HEADS) * BN, bars.ptr_to([it % STAGES]))
        else:                                                         # two consumer warpgroups, 64 rows each
            T.ptx.setmaxnreg.inc.sync.aligned.u32(232)
            wg = T.meta_var((tx - 128) // 128)
            lt = T.meta_var(tx % 128)
            lane = T.meta_var(tx % 32)
            for i in T.serial(NTILE):
                tile[0] = (bx + i * GRID) // HEADS
                tile[1] = (bx + i * GRID) % HEADS
                r0 = T.meta_var(tile[0] * BM + wg * 64 + (lt % 32) // 4 + (lt // 32) * 16)
                # this warp's cache row, while the producer fills the ring
                tok = T.meta_var((tile[0] * HEADS + tile[1]) * TOK_PER_CTA + (tx - 128) // 32)
                if tok < M:
                    ps[0] = T.Cast("int32", SLOT[tok])
                    if ps[0] >= 0:
                        for u in T.unroll(2):
                            e0 = T.meta_var((u * 32 + lane) * VEC)
                            T.tile.copy(rv[u * VEC:(u + 1) * VEC], X[tok, Q_RANK + e0:Q_RANK + e0 + VEC])
                        for u in T.unroll(2):
                            e0 = T.meta_var((u * 32 + lane) * VEC)
                            T.tile.copy(C[ps[0], e0:e0 + VEC], rv[u * VEC:(u + 1) * VEC])
                        ps[1] = T.Cast("int32", POS[tok])
                        v[0] = T.Cast("float32", CS[ps[1], lane])
                        v[1] = T.Cast("float32", CS[ps[1], HALF + lane])
                        v[2] = T.Cast("float32", X[tok, Q_RANK + KV_RANK + lane])
                        v[3] = T.Cast("float32", X[tok, Q_RANK + KV_RANK + HALF + lane])
                        C[ps[0], KV_RANK + lane] = T.Cast("bfloat16", _bf(v[2] * v[0]) - _bf(v[3] * v[1]))
                        C[ps[0], KV_RANK + HALF + lane] = T.Cast("bfloat16", _bf(v[3] * v[0]) + _bf(v[2] * v[1]))
                # cos/sin of this thread's rope columns: element (q, h, j), q = 16..19 -> cs[(q - 16) * 4 + h * 2 + j]
                for h in T.unroll(2):
                    ps[h] = T.Cast("int32", POS[T.min(r0 + h * 8, M - 1)])
                for qq in T.unroll(4):
                    for h in T.unroll(2):
                        for j in T.unroll(2):
                            x = T.meta_var(qq * 8 + (lt % 4) * 2 + j)
                            cs[qq * 4 + h * 2 + j] = T.Cast("float32", CS[ps[h], x])
                            cs[16 + qq * 4 + h * 2 + j] = T.Cast("float32", CS[ps[h], HALF + x])
                for e in T.unroll(NACC):
                    acc[e] = T.float32(0)
                for kt in T.serial(KT):
                    it = T.meta_var(i * KT + kt)
                    T.cuda.mbarrier_wait(bars.ptr_to([it % STAGES]), (it // STAGES) & 1)
                    for e in T.unroll(NACC):
                        T.cuda.wgmma.noop_barrier(acc[e])
                    T.ptx.wgmma.fence.sync.aligned()
                    for kk in T.unroll(BK // 16):  # 16 bf16 = 32 bytes per k16 step inside the swizzled row
                        T.cuda.wgmma.encode_matrix_descriptor(T.address_of(descA[0]),
                                                              A_s.ptr_to([it % STAGES, wg * 64, kk * 16]),
                                                              1, 64, SWIZZLE_128B)
                        T.cuda.wgmma.encode_matrix_descriptor(T.address_of(descB[0]),
                                                              B_s.ptr_to([it % STAGES, 0, kk * 16]),
                                                              1, 64, SWIZZLE_128B)
                        T.ptx[WGMMA](*[acc[e] for e in range(NACC)], descA[0], descB[0], T.bool(True), 1, 1, 0, 0)
                    T.ptx.wgmma.commit_group.sync.aligned()
                    T.ptx.wgmma.wait_group.sync.aligned(1)          # the previous k-tile's batch has finished
                    for e in T.unroll(NACC):
                        T.cuda.wgmma.noop_barrier(acc[e])
                    if kt > 0 and lt % 32 == 0:                     # one arrive per warp frees that stage
                        T.ptx.mbarrier.arrive.shared.b64(bars.ptr_to([STAGES + (it - 1) % STAGES]))
                T.ptx.wgmma.wait_group.sync.aligned(0)
                for e in T.unroll(NACC):
                    T.cuda.wgmma.noop_barrier(acc[e])
                if lt % 32 == 0:                                    # the tile's last stage, for the next tile
                    T.ptx.mbarrier.arrive.shared.b64(bars.ptr_to([STAGES + (i * KT + KT - 1) % STAGES]))
                for qq in T.unroll(16):        # nope: element (qq, h, j) at row r0 + 8h, col 8qq + 2(lt % 4) + j
                    for h in T.unroll(2):
                        for j in T.unroll(2):
                            row = T.meta_var(r0 + h * 8)
                            col = T.meta_var(qq * 8 + (lt % 4) * 2 + j)
                            if row < M:
                                Q[row, tile[1], col] = T.Cast("bfloat16", acc[qq * 4 + h * 2 + j])
                for qq in T.unroll(4):         # rope: column 128 + x (element 64 + k) and 160 + x (80 + k)
                    for h in T.unroll(2):
                        for j in T.unroll(2):
                            k = T.meta_var(qq * 4 + h * 2 + j)
                            row = T.meta_var(r0 + h * 8)
                            col = T.meta_var(NOPE + qq * 8 + (lt % 4) * 2 + j)
                            if row < M:
                                v[0] = _bf(acc[64 + k])
                                v[1] = _bf(acc[80 + k])
                                Q[row, tile[1], col] = T.Cast("bfloat16", _bf(v[0] * cs[k]) - _bf(v[1] * cs[16 + k]))
                                Q[row, tile[1], col + HALF] = T.Cast("bfloat16", _bf(v[1] * cs[k]) + _bf(v[0] * cs[16 + k]))

    return mla_prologue


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _build(func, arch):
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    with target:
        return tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")


def _prepare(qkv_lora, q_b_weight, positions, cos_sin_cache, slot_mapping, kv_cache, arch=None):
    assert qkv_lora.shape[1] == WIDTH and tuple(q_b_weight.shape) == (HEADS * HD, Q_RANK)
    assert kv_cache.shape[2] == 1 and kv_cache.shape[3] == ROW
    assert all(t.is_contiguous() for t in (qkv_lora, q_b_weight, positions, cos_sin_cache, slot_mapping, kv_cache))
    assert positions.dtype == torch.int64 and slot_mapping.dtype == torch.int64
    block_size = kv_cache.shape[1]
    if block_size not in _COMPILED:
        sms = H200_SMS if arch else torch.cuda.get_device_properties(qkv_lora.device).multi_processor_count
        _COMPILED[block_size] = _build(_make(block_size, sms), arch or _arch())
    return [_COMPILED[block_size]]


def solve(qkv_lora, q_b_weight, positions, cos_sin_cache, slot_mapping, kv_cache):
    exe = _COMPILED.get(kv_cache.shape[1])
    if exe is None:
        (exe,) = _prepare(qkv_lora, q_b_weight, positions, cos_sin_cache, slot_mapping, kv_cache)
    q = torch.empty(qkv_lora.shape[0], HEADS, HD, dtype=qkv_lora.dtype, device=qkv_lora.device)
    exe(qkv_lora, q_b_weight, positions, cos_sin_cache, slot_mapping, kv_cache, q)
    return q
