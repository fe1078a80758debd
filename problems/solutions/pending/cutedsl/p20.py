"""p20 DeepSeek MLA prologue (q projection, NeoX RoPE on q and k_pe, compressed paged-cache write) in CuTe DSL.

One launch. A tile is 128 tokens x 192 columns of q = q_c @ q_b_weight^T, i.e. one head's nope 128 +
rope 64 columns for 128 tokens (16 heads x 16 token tiles = 256 tiles); a persistent grid of one CTA per
SM walks tiles bx, bx + grid, ... (two each on 132 SMs, heads fastest). 384 threads, warp-specialised:

* warp 0 of warpgroup 0 (setmaxregister 40) streams the k-tiles by TMA (q_c read in place as a strided
  view of qkv_lora, row stride 2112) into a 5-stage ring of 40 KiB stages, running ahead across tiles, so
  the next tile's loads overlap the current tile's epilogue;
* warpgroups 1 and 2 (setmaxregister 232), 64 rows each: bf16 WGMMA m64n192k16 with fp32 accumulation,
  one batch left in flight (wait_group(1)) and the stage released a k-tile late. A 128 x 192 tile moves
  13 KB of operands per MFLOP through L2 against the shipped 64 x 128 tile's 23 (which ran at ~9 TB/s).
* Epilogue: q rounded to bf16 as the reference's GEMM output; in the m64n192 fragment a thread holds
  columns c0 + 8c + j, so rope column 128 + x (c = 16..19) and its NeoX partner 160 + x (c = 20..23) sit
  in the same thread (elements i and i + 16): the rotation is done in registers, each product and sum
  rounded to bf16 as torch's bf16 arithmetic does (products of two bf16 numbers are exact in fp32).
  cos/sin of the thread's two rows are loaded before the main loop; q is stored in bf16 pairs.
* Cache: before each tile's main loop each of the 8 consumer warps takes one token (tile t handles tokens
  8t .. 8t + 7): for a valid slot it copies kv_c (512 bf16, 16-byte vectors) and writes the rotated k_pe
  into cache row slot of the flat [blocks * 16, 576] view; slot -1 writes nothing.

Numerics are those of the shipped two-kernel solution (same k16 WGMMA accumulation order along K, same
bf16 rounding steps), which passed at ~0.23 (q) and ~0.14 (cache) of the allowance on the H200.
solve() does one torch.empty and the launch: the views (q_c, the flat cache, q as [tokens, 3072]) are
built inside the jit function.
"""
import torch

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

HEADS, NOPE, ROPE, KV_RANK, Q_RANK = 16, 128, 64, 512, 1536
HALF = ROPE // 2
HD = NOPE + ROPE                 # 192: one head = one n-tile
BM = 128
THREADS = 384                    # producer warpgroup + two consumer warpgroups
CONSUMER_WARPS = 8
PRODUCER_REGS, CONSUMER_REGS = 40, 232
STAGES = 5
TOK_PER_CTA = CONSUMER_WARPS     # cache rows written per tile, one per consumer warp
H200_SMS = 132                   # multiprocessors of the target when compiling without a GPU
VEC = 8                          # bf16 per 16-byte access


def _check_fragment(layout):
    """The epilogue indexes the m64n192 accumulator by position: element j + 2h + 4c sits at tile row r0 + 8h,
    column c0 + 8c + j (so element 64 + k is rope column 128 + x and 80 + k is 160 + x); checked while tracing."""
    if str(layout) != "((2,2,24),1,1):((1@1,8@0,8@1),0,0)":
        raise ValueError(f"unexpected WGMMA accumulator layout {layout}")


def _bf(x):
    """x rounded to bf16 and back (the reference's bf16 arithmetic, round to nearest even)."""
    return Float32(x.to(cutlass.BFloat16))


class Fused:
    def __init__(self, block_size: int, sms: int):
        self.block_size = block_size
        self.sms = sms

    @cute.jit
    def __call__(self, qkv: cute.Tensor, w: cute.Tensor, positions: cute.Tensor, cos_sin: cute.Tensor,
                 slots: cute.Tensor, cache4: cute.Tensor, q3: cute.Tensor, stream):
        m = qkv.shape[0]
        mA = cute.make_tensor(qkv.iterator, cute.make_layout((m, Q_RANK), stride=(qkv.shape[1], 1)))
        mQ = cute.make_tensor(q3.iterator, cute.make_layout((m, HEADS * HD), stride=(HEADS * HD, 1)))
        cache = cute.make_tensor(cache4.iterator, cute.make_layout(
            (cache4.shape[0] * self.block_size, KV_RANK + ROPE), stride=(KV_RANK + ROPE, 1)))
        ab = mA.element_type
        a_l, b_l = utils.LayoutEnum.from_tensor(mA), utils.LayoutEnum.from_tensor(w)
        tiled_mma = sm90_utils.make_trivial_tiled_mma(
            ab, ab, a_l.sm90_mma_major_mode(), b_l.sm90_mma_major_mode(), Float32, (2, 1, 1),
            tiler_mn=(64, HD))                                       # two warpgroups stacked along M
        bk = cute.size(tiled_mma.shape_mnk, mode=[2]) * 4          # 4 x k16 = 64 bf16 = one 128-byte row
        tile = (BM, HD, bk)
        sA_l = sm90_utils.make_smem_layout_a(a_l, tile, ab, STAGES)
        sB_l = sm90_utils.make_smem_layout_b(b_l, tile, ab, STAGES)
        op = cpasync.CopyBulkTensorTileG2SOp()
        tma_a, gA = cpasync.make_tiled_tma_atom(op, mA, cute.slice_(sA_l, (None, None, 0)), (BM, bk))
        tma_b, gB = cpasync.make_tiled_tma_atom(op, w, cute.slice_(sB_l, (None, None, 0)), (HD, bk))

        @cute.struct
        class Smem:
            mbar: cute.struct.MemRange[cutlass.Int64, STAGES * 2]
            sA: cute.struct.Align[cute.struct.MemRange[ab, cute.cosize(sA_l)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[ab, cute.cosize(sB_l)], 1024]
        self.smem_t = Smem
        self.ab_dtype = ab
        self.tile = tile
        tiles = cute.ceil_div(m, BM) * HEADS
        self.kernel(tma_a, gA, tma_b, gB, mQ, qkv, positions, cos_sin, slots, cache, tiled_mma,
                    sA_l, sB_l).launch(grid=[cutlass.min(tiles, self.sms), 1, 1], block=[THREADS, 1, 1],
                                       min_blocks_per_mp=1, stream=stream)

    @cute.kernel
    def kernel(self, tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom, mB: cute.Tensor, mQ: cute.Tensor,
               qkv: cute.Tensor, positions: cute.Tensor, cos_sin: cute.Tensor, slots: cute.Tensor,
               cache: cute.Tensor, tiled_mma: cute.TiledMma, sA_l: cute.ComposedLayout, sB_l: cute.ComposedLayout):
        tidx, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        nctas, _, _ = cute.arch.grid_dim()
        m = mQ.shape[0]
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = tidx % 32
        if warp == 0:
            cpasync.prefetch_descriptor(tma_a)
            cpasync.prefetch_descriptor(tma_b)
        storage = cutlass.utils.SmemAllocator().allocate(self.smem_t)
        tx_bytes = cute.size_in_bytes(self.ab_dtype, cute.slice_(sA_l, (None, None, 0))) + \
            cute.size_in_bytes(self.ab_dtype, cute.slice_(sB_l, (None, None, 0)))
        pipe = pipeline.PipelineTmaAsync.create(       # one empty-barrier arrive per consumer warp
            barrier_storage=storage.mbar.data_ptr(), num_stages=STAGES,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, CONSUMER_WARPS),
            tx_count=tx_bytes, cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)))
        sA = storage.sA.get_tensor(sA_l.outer, swizzle=sA_l.inner)
        sB = storage.sB.get_tensor(sB_l.outer, swizzle=sB_l.inner)
        gA = cute.local_tile(mA, (BM, self.tile[2]), (None, None))          # (bm, bk, m tiles, k tiles)
        gB = cute.local_tile(mB, (HD, self.tile[2]), (None, None))          # (bn, bk, heads, k tiles)
        tiles = cute.ceil_div(m, BM) * HEADS
        k_tiles = cute.size(gA, mode=[3])
        if warp < 4:                                                       # producer warpgroup
            cute.arch.setmaxregister_decrease(PRODUCER_REGS)
            if warp == 0:
                tAsA, tAgA = cpasync.tma_partition(tma_a, 0, cute.make_layout(1),
                                                   cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2))
                tBsB, tBgB = cpasync.tma_partition(tma_b, 0, cute.make_layout(1),
                                                   cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2))
                prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, STAGES)
                t = cutlass.Int32(bid)
                while t < tiles:                                           # runs ahead across tiles
                    mt = t // HEADS
                    nt = t % HEADS
                    for kt in cutlass.range(k_tiles, unroll=1):
                        pipe.producer_acquire(prod)
                        cute.copy(tma_a, tAgA[(None, mt, kt)], tAsA[(None, prod.index)],
                                  tma_bar_ptr=pipe.producer_get_barrier(prod))
                        cute.copy(tma_b, tBgB[(None, nt, kt)], tBsB[(None, prod.index)],
                                  tma_bar_ptr=pipe.producer_get_barrier(prod))
                        pipe.producer_commit(prod)
                        prod.advance()
                    t = t + nctas
                pipe.producer_tail(prod)
        else:                                                              # two consumer warpgroups
            cute.arch.setmaxregister_increase(CONSUMER_REGS)
            thr_mma = tiled_mma.get_slice(tidx - 128)
            tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
            tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
            cT = thr_mma.partition_C(cute.make_identity_tensor((BM, HD)))
            _check_fragment(cT.layout)
            acc = cute.make_rmem_tensor(cT.shape, Float32)
            cs = cute.make_rmem_tensor((2 * 16,), Float32)
            r0 = cT[0][0]                       # element j + 2h + 4c: tile row r0 + 8h, column c0 + 8c + j
            c0 = cT[0][1]
            cw = warp - 4                       # consumer warp: one cache row per tile
            cons = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, STAGES)
            done = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, STAGES)
            t = cutlass.Int32(bid)
            while t < tiles:
                mt = t // HEADS
                nt = t % HEADS
                row0 = mt * BM + r0
                # this tile's cache rows (tokens 8t .. 8t + 7), while the producer fills the ring
                tok = t * TOK_PER_CTA + cw
                if tok < m:
                    slot = Int32(slots[tok])
                    if slot >= 0:
                        src = cute.zipped_divide(qkv[tok, None], (VEC,))
                        dst = cute.zipped_divide(cache[slot, None], (VEC,))
                        rv = cute.make_rmem_tensor((VEC, 2), qkv.element_type)
                        for u in cutlass.range_constexpr(2):
                            cute.autovec_copy(src[None, Q_RANK // VEC + u * 32 + lane], rv[None, u])
                        for u in cutlass.range_constexpr(2):
                            cute.autovec_copy(rv[None, u], dst[None, u * 32 + lane])
                        pos = Int32(positions[tok])
                        c = Float32(cos_sin[pos, lane])
                        s = Float32(cos_sin[pos, HALF + lane])
                        k1 = Float32(qkv[tok, Q_RANK + KV_RANK + lane])
                        k2 = Float32(qkv[tok, Q_RANK + KV_RANK + HALF + lane])
                        cache[slot, KV_RANK + lane] = (_bf(k1 * c) - _bf(k2 * s)).to(cache.element_type)
                        cache[slot, KV_RANK + HALF + lane] = (_bf(k2 * c) + _bf(k1 * s)).to(cache.element_type)
                # cos/sin of this thread's rope columns: element 64 + k, k = j + 2h + 4(c - 16), column 128 + x
                for h in cutlass.range_constexpr(2):
                    pos_h = Int32(positions[cutlass.min(row0 + 8 * h, m - 1)])
                    for cc in cutlass.range_constexpr(4):
                        for j in cutlass.range_constexpr(2):
                            k = j + 2 * h + 4 * cc
                            x = c0 + 8 * cc + j
                            cs[k] = Float32(cos_sin[pos_h, x])
                            cs[16 + k] = Float32(cos_sin[pos_h, HALF + x])
                acc.fill(0.0)
                tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
                for kt in cutlass.range(k_tiles, unroll=1):
                    pipe.consumer_wait(cons)
                    warpgroup.fence()
                    for kb in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
                        cute.gemm(tiled_mma, acc, tCrA[None, None, kb, cons.index],
                                  tCrB[None, None, kb, cons.index], acc)
                    warpgroup.commit_group()
                    warpgroup.wait_group(1)               # the previous k-tile's batch has finished
                    cons.advance()
                    if kt > 0:                            # so its stage goes back to the producer
                        pipe.consumer_release(done)
                        done.advance()
                warpgroup.wait_group(0)
                pipe.consumer_release(done)               # the tile's last stage
                done.advance()
                for k in cutlass.range_constexpr(16):     # rope columns 128 + x (element 64 + k), 160 + x (80 + k)
                    x1 = _bf(acc[64 + k])
                    x2 = _bf(acc[80 + k])
                    acc[64 + k] = _bf(x1 * cs[k]) - _bf(x2 * cs[16 + k])
                    acc[80 + k] = _bf(x2 * cs[k]) + _bf(x1 * cs[16 + k])
                for h in cutlass.range_constexpr(2):      # q rounded to bf16 (the rope values already are), pairs
                    row = row0 + 8 * h
                    if row < m:
                        qrow = cute.zipped_divide(mQ[row, None], (2,))
                        for c in cutlass.range_constexpr(HD // 8):
                            ro = cute.make_rmem_tensor((2,), mQ.element_type)
                            for j in cutlass.range_constexpr(2):
                                ro[j] = acc[j + 2 * h + 4 * c].to(mQ.element_type)
                            cute.autovec_copy(ro, qrow[None, (nt * HD + c0 + 8 * c) // 2])
                t = t + nctas


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _prepare(qkv_lora, q_b_weight, positions, cos_sin_cache, slot_mapping, kv_cache, arch=None):
    width, n = qkv_lora.shape[1], q_b_weight.shape[0]
    assert width == Q_RANK + KV_RANK + ROPE and n == HEADS * HD and kv_cache.shape[-1] == KV_RANK + ROPE
    assert kv_cache.shape[2] == 1 and q_b_weight.shape[1] == Q_RANK
    assert all(t.is_contiguous() for t in (qkv_lora, q_b_weight, positions, cos_sin_cache, slot_mapping, kv_cache))
    assert positions.dtype == torch.int64 and slot_mapping.dtype == torch.int64
    block_size = kv_cache.shape[1]
    if block_size not in _COMPILED:
        sms = H200_SMS if arch else torch.cuda.get_device_properties(qkv_lora.device).multi_processor_count
        bf = cutlass.BFloat16
        m = cute.sym_int()
        qkv = make_fake_compact_tensor(bf, (m, width), stride_order=(1, 0), assumed_align=16)
        w = make_fake_compact_tensor(bf, (n, Q_RANK), stride_order=(1, 0), assumed_align=16)
        idx = make_fake_compact_tensor(cutlass.Int64, (m,))
        cs = make_fake_compact_tensor(bf, (cute.sym_int(), ROPE), stride_order=(1, 0))
        cache = make_fake_compact_tensor(bf, (cute.sym_int(), block_size, 1, KV_RANK + ROPE),
                                         stride_order=(3, 2, 1, 0), assumed_align=16)
        q = make_fake_compact_tensor(bf, (m, HEADS, HD), stride_order=(2, 1, 0), assumed_align=16)
        _COMPILED[block_size] = cute.compile(Fused(block_size, sms), qkv, w, idx, cs, idx, cache, q,
                                             make_fake_stream(use_tvm_ffi_env_stream=True),
                                             options=f"--gpu-arch {arch or _arch()} --enable-tvm-ffi")
    return [_COMPILED[block_size]]


def solve(qkv_lora, q_b_weight, positions, cos_sin_cache, slot_mapping, kv_cache):
    fn = _COMPILED.get(kv_cache.shape[1])
    if fn is None:
        (fn,) = _prepare(qkv_lora, q_b_weight, positions, cos_sin_cache, slot_mapping, kv_cache)
    q = torch.empty(qkv_lora.shape[0], HEADS, HD, dtype=qkv_lora.dtype, device=qkv_lora.device)
    fn(qkv_lora, q_b_weight, positions, cos_sin_cache, slot_mapping, kv_cache, q)
    return q
