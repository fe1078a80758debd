"""p20 DeepSeek MLA prologue (q projection, NeoX RoPE on q and k_pe, compressed paged-cache write) in CuTe DSL.

One launch. A CTA computes one 128-token x 192-column tile of q = q_c @ q_b_weight^T, i.e. one head's
nope 128 + rope 64 columns for 128 tokens (grid 16 heads x 16 token tiles = 256 CTAs, about two waves on
132 SMs), and writes it rotated:

* GEMM: bf16 WGMMA (m64n192k16) with fp32 accumulation, two consumer warpgroups of 64 rows each; warp 0
  also issues the TMA loads (q_c read in place as a strided view of qkv_lora, row stride 2112) into a
  5-stage mbarrier ring of 40 KiB stages; one WGMMA batch stays in flight (wait_group(1)) and a stage is
  released one k-tile late. A 128 x 192 tile moves 13 KB of operands per MFLOP through L2 against the
  shipped 64 x 128 tile's 23 (which ran at ~9 TB/s of L2 traffic).
* Epilogue: q rounded to bf16 as the reference's GEMM output; in the m64n192 fragment a thread holds
  columns 8c + 2(lane % 4) + j, so rope column 128 + x (c = 16..19) and its NeoX partner 160 + x
  (c = 20..23) sit in the same thread: the rotation is done in registers, each product and sum rounded to
  bf16 as torch's bf16 arithmetic does (products of two bf16 numbers are exact in fp32). cos/sin of the
  thread's two rows are loaded before the main loop.
* Cache: before the main loop (while the first TMA loads are in flight) each of the 8 warps takes one token
  (CTA b handles tokens 8b .. 8b + 7): for a valid slot it copies kv_c (512 bf16, 16-byte vectors) and
  writes the rotated k_pe into cache row slot of the flat [blocks * 16, 576] view; slot -1 writes nothing.

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
THREADS = 256                    # two consumer warpgroups; warp 0 also produces
STAGES = 5
TOK_PER_CTA = THREADS // 32      # cache rows written per CTA, one per warp
VEC = 8                          # bf16 per 16-byte access


def _check_fragment(layout_c, layout_coord):
    """Trace-time check of the m64n192 fragment order the epilogue indexes by position: element j + 2h + 4c
    at row r0 + 8h, column 8c + 2(lane % 4) + j (so element 64 + k is rope column 128 + x, 80 + k is 160 + x)."""
    assert str(layout_coord) == "((2,2,24),1,1):((1@1,8@0,8@1),0,0)", layout_coord
    assert str(layout_c).startswith("((2,2,24),1,1):((1,"), layout_c


def _bf(x):
    """x rounded to bf16 and back (the reference's bf16 arithmetic, round to nearest even)."""
    return Float32(x.to(cutlass.BFloat16))


class Fused:
    def __init__(self, block_size: int):
        self.block_size = block_size

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
            tiler_mn=(64, HD))
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
        grid = (HEADS, cute.ceil_div(m, BM), 1)          # heads fastest: the 16 CTAs of a token tile share A
        self.kernel(tma_a, gA, tma_b, gB, mQ, qkv, positions, cos_sin, slots, cache, tiled_mma,
                    sA_l, sB_l).launch(grid=grid, block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom, mB: cute.Tensor, mQ: cute.Tensor,
               qkv: cute.Tensor, positions: cute.Tensor, cos_sin: cute.Tensor, slots: cute.Tensor,
               cache: cute.Tensor, tiled_mma: cute.TiledMma, sA_l: cute.ComposedLayout, sB_l: cute.ComposedLayout):
        tidx, _, _ = cute.arch.thread_idx()
        bn, bm, _ = cute.arch.block_idx()
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
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, THREADS // 32),
            tx_count=tx_bytes, cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)))
        sA = storage.sA.get_tensor(sA_l.outer, swizzle=sA_l.inner)
        sB = storage.sB.get_tensor(sB_l.outer, swizzle=sB_l.inner)
        gA = cute.local_tile(mA, self.tile, (bm, bn, None), proj=(1, None, 1))
        gB = cute.local_tile(mB, self.tile, (bm, bn, None), proj=(None, 1, 1))
        gC = cute.local_tile(mQ, self.tile, (bm, bn, None), proj=(1, 1, None))
        tAsA, tAgA = cpasync.tma_partition(tma_a, 0, cute.make_layout(1),
                                           cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2))
        tBsB, tBgB = cpasync.tma_partition(tma_b, 0, cute.make_layout(1),
                                           cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2))
        wg = cute.arch.make_warp_uniform(tidx // 128)
        wg_mma = tiled_mma.get_slice(cute.make_layout(2, stride=128)(wg))   # this warpgroup's 64 rows
        tCrA = tiled_mma.make_fragment_A(wg_mma.partition_A(sA))
        tCrB = tiled_mma.make_fragment_B(wg_mma.partition_B(sB))
        thr_mma = tiled_mma.get_slice(tidx)
        tCgC = thr_mma.partition_C(gC)
        cC = thr_mma.partition_C(cute.local_tile(cute.make_identity_tensor(mQ.shape), self.tile,
                                                 (bm, bn, None), proj=(1, 1, None)))
        acc = cute.make_rmem_tensor(tCgC.shape, Float32)
        _check_fragment(tCgC.layout, cC.layout)
        acc.fill(0.0)
        k_tiles = cute.size(gA, mode=[2])
        prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, STAGES)
        cons = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, STAGES)
        done = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, STAGES)
        if warp == 0:
            for _ in cutlass.range(cutlass.min(STAGES, k_tiles), unroll=1):
                self.load(pipe, prod, tma_a, tAgA, tAsA, tma_b, tBgB, tBsB)
                prod.advance()

        # the cache rows of this CTA's tokens, while the first loads are in flight
        tok = (bm * HEADS + bn) * TOK_PER_CTA + warp
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

        # cos/sin of this thread's rope columns (fragment elements 64..79: j + 2h + 4(c - 16), c = 16..19)
        cs = cute.make_rmem_tensor((2 * 16,), Float32)
        for k in cutlass.range_constexpr(16):
            i = 64 + k
            row = cutlass.min(cC[i][0], m - 1)
            x = cC[i][1] - bn * HD - NOPE
            pos = Int32(positions[row])
            cs[k] = Float32(cos_sin[pos, x])
            cs[16 + k] = Float32(cos_sin[pos, HALF + x])

        tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
        for kt in cutlass.range(k_tiles, unroll=1):
            pipe.consumer_wait(cons)
            warpgroup.fence()
            for kb in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
                cute.gemm(tiled_mma, acc, tCrA[None, None, kb, cons.index], tCrB[None, None, kb, cons.index], acc)
            warpgroup.commit_group()
            warpgroup.wait_group(1)                   # the previous k-tile's batch has finished
            cons.advance()
            if kt > 0:                                # so its stage goes back to the producer
                pipe.consumer_release(done)
                done.advance()
                # only after a release: warp 0 must never wait on a stage its own warpgroup holds
                if warp == 0 and prod.count < k_tiles:
                    self.load(pipe, prod, tma_a, tAgA, tAsA, tma_b, tBgB, tBsB)
                    prod.advance()
        warpgroup.wait_group(0)
        pipe.consumer_release(done)

        for k in cutlass.range_constexpr(16):          # rope columns 128 + x (element 64 + k), 160 + x (80 + k)
            x1 = _bf(acc[64 + k])
            x2 = _bf(acc[80 + k])
            c = cs[k]
            s = cs[16 + k]
            acc[64 + k] = _bf(x1 * c) - _bf(x2 * s)
            acc[80 + k] = _bf(x2 * c) + _bf(x1 * s)
        for i in cutlass.range_constexpr(96):          # q rounded to bf16 (the rope values already are)
            if cute.elem_less(cC[i], mQ.shape):
                tCgC[i] = acc[i].to(mQ.element_type)

    @cute.jit
    def load(self, pipe, prod, tma_a, tAgA, tAsA, tma_b, tBgB, tBsB):
        pipe.producer_acquire(prod)
        bar = pipe.producer_get_barrier(prod)
        cute.copy(tma_a, tAgA[(None, prod.count)], tAsA[(None, prod.index)], tma_bar_ptr=bar)
        cute.copy(tma_b, tBgB[(None, prod.count)], tBsB[(None, prod.index)], tma_bar_ptr=bar)
        pipe.producer_commit(prod)


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
        bf = cutlass.BFloat16
        m = cute.sym_int()
        qkv = make_fake_compact_tensor(bf, (m, width), stride_order=(1, 0), assumed_align=16)
        w = make_fake_compact_tensor(bf, (n, Q_RANK), stride_order=(1, 0), assumed_align=16)
        idx = make_fake_compact_tensor(cutlass.Int64, (m,))
        cs = make_fake_compact_tensor(bf, (cute.sym_int(), ROPE), stride_order=(1, 0))
        cache = make_fake_compact_tensor(bf, (cute.sym_int(), block_size, 1, KV_RANK + ROPE),
                                         stride_order=(3, 2, 1, 0), assumed_align=16)
        q = make_fake_compact_tensor(bf, (m, HEADS, HD), stride_order=(2, 1, 0), assumed_align=16)
        _COMPILED[block_size] = cute.compile(Fused(block_size), qkv, w, idx, cs, idx, cache, q,
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
