"""p20 DeepSeek MLA prologue (q projection, NeoX RoPE on q and k_pe, compressed paged-cache write) in CuTe DSL.

Kernel 1 is p60's bf16 WGMMA GEMM (64x128 CTA tiles, N tiles fastest, TMA into a 4-stage mbarrier
pipeline, fp32 accumulation as cuBLAS) without the scale promotion, reading q_c in place as a strided
view of qkv_lora (row stride 2112): q = q_c @ q_b_weight^T rounded to bf16, written straight into the
[tokens, 16 * 192] output (the weight is head-major: nope 128 then rope 64 per head).
Kernel 2, a CTA of 128 threads per token, rotates in place the 16 heads' rope halves of q (4 of the 512
(i, i + 32) pairs per thread) and, in warp 0, k_pe; each product and each sum is rounded to bf16 as
the reference's bf16 arithmetic does (the products of two bf16 numbers are exact in fp32, so this is
torch's rounding bit for bit).  For a valid slot it writes [kv_c | rotated k_pe] into the cache row
slot (block slot // 16, offset slot % 16 of the flat [blocks * 16, 576] view); slot -1 writes nothing.
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
THREADS = 128
PAIRS = HEADS * HALF // THREADS               # q rope pairs per thread


def _bf(x):
    """x rounded to bf16 and back (the reference's bf16 arithmetic, round to nearest even)."""
    return Float32(x.to(cutlass.BFloat16))


class RopeCache:
    """q's rope halves rotated in place; kv_cache[slot] = [kv_c | rotated k_pe] for slot >= 0."""

    @cute.jit
    def __call__(self, q: cute.Tensor, qkv: cute.Tensor, positions: cute.Tensor, cos_sin: cute.Tensor,
                 slots: cute.Tensor, cache: cute.Tensor, stream):
        self.kernel(q, qkv, positions, cos_sin, slots, cache).launch(grid=[q.shape[0], 1, 1],
                                                                     block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, q: cute.Tensor, qkv: cute.Tensor, positions: cute.Tensor, cos_sin: cute.Tensor,
               slots: cute.Tensor, cache: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        tok, _, _ = cute.arch.block_idx()
        pos = Int32(positions[tok])
        for r in cutlass.range_constexpr(PAIRS):
            p = r * THREADS + tidx
            i = p % HALF
            base = (p // HALF) * (NOPE + ROPE) + NOPE + i
            c = Float32(cos_sin[pos, i])
            s = Float32(cos_sin[pos, HALF + i])
            x1 = Float32(q[tok, base])
            x2 = Float32(q[tok, base + HALF])
            q[tok, base] = (_bf(x1 * c) - _bf(x2 * s)).to(q.element_type)
            q[tok, base + HALF] = (_bf(x2 * c) + _bf(x1 * s)).to(q.element_type)
        slot = Int32(slots[tok])
        if tidx < HALF:
            c = Float32(cos_sin[pos, tidx])
            s = Float32(cos_sin[pos, HALF + tidx])
            k1 = Float32(qkv[tok, Q_RANK + KV_RANK + tidx])
            k2 = Float32(qkv[tok, Q_RANK + KV_RANK + HALF + tidx])
            if slot >= 0:
                cache[slot, KV_RANK + tidx] = (_bf(k1 * c) - _bf(k2 * s)).to(cache.element_type)
                cache[slot, KV_RANK + HALF + tidx] = (_bf(k2 * c) + _bf(k1 * s)).to(cache.element_type)
        if slot >= 0:
            for e in cutlass.range_constexpr(KV_RANK // THREADS):
                j = e * THREADS + tidx
                cache[slot, j] = qkv[tok, Q_RANK + j]


class Gemm:
    """C(M,N) = A(M,K) @ B(N,K)^T with A the first K columns of the rows of `src` (a strided view: q_c of
    qkv_lora), bf16 operands, fp32 accumulation, C rounded to bf16."""

    def __init__(self, k: int, stages: int = 4):
        self.bm, self.bn = 64, 128
        self.k = k
        self.stages = stages

    @cute.jit
    def __call__(self, src: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, stream):
        mA = cute.make_tensor(src.iterator, cute.make_layout((src.shape[0], self.k), stride=(src.shape[1], 1)))
        ab = mA.element_type
        a_l, b_l = utils.LayoutEnum.from_tensor(mA), utils.LayoutEnum.from_tensor(mB)
        tiled_mma = sm90_utils.make_trivial_tiled_mma(
            ab, ab, a_l.sm90_mma_major_mode(), b_l.sm90_mma_major_mode(), Float32, (1, 1, 1),
            tiler_mn=(64, self.bn))
        bk = cute.size(tiled_mma.shape_mnk, mode=[2]) * 4          # 4 x k16 = 64 bf16 = one 128-byte row
        tile = (self.bm, self.bn, bk)
        sA_l = sm90_utils.make_smem_layout_a(a_l, tile, ab, self.stages)
        sB_l = sm90_utils.make_smem_layout_b(b_l, tile, ab, self.stages)
        tma_a, gA_tma = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mA,
                                                    cute.slice_(sA_l, (None, None, 0)), (self.bm, bk))
        tma_b, gB_tma = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mB,
                                                    cute.slice_(sB_l, (None, None, 0)), (self.bn, bk))

        @cute.struct
        class Smem:
            mbar: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            sA: cute.struct.Align[cute.struct.MemRange[ab, cute.cosize(sA_l)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[ab, cute.cosize(sB_l)], 1024]
        self.smem_t = Smem
        self.ab_dtype = ab
        self.tile = tile
        grid = (cute.ceil_div(mC.shape[1], self.bn), cute.ceil_div(mC.shape[0], self.bm), 1)  # N fastest: A read once
        self.kernel(tma_a, gA_tma, tma_b, gB_tma, mC, tiled_mma, sA_l, sB_l).launch(
            grid=grid, block=[128, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom, mB: cute.Tensor, mC: cute.Tensor,
               tiled_mma: cute.TiledMma, sA_l: cute.ComposedLayout, sB_l: cute.ComposedLayout):
        tidx, _, _ = cute.arch.thread_idx()
        bn, bm, _ = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp == 0:
            cpasync.prefetch_descriptor(tma_a)
            cpasync.prefetch_descriptor(tma_b)
        storage = cutlass.memory.SmemAllocator().allocate(self.smem_t)
        tx_bytes = cute.size_in_bytes(self.ab_dtype, cute.slice_(sA_l, (None, None, 0))) + \
            cute.size_in_bytes(self.ab_dtype, cute.slice_(sB_l, (None, None, 0)))
        pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar.data_ptr(), num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 4),
            tx_count=tx_bytes, cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)))
        sA = storage.sA.get_tensor(sA_l.outer, swizzle=sA_l.inner)
        sB = storage.sB.get_tensor(sB_l.outer, swizzle=sB_l.inner)
        gA = cute.local_tile(mA, self.tile, (bm, bn, None), proj=(1, None, 1))
        gB = cute.local_tile(mB, self.tile, (bm, bn, None), proj=(None, 1, 1))
        gC = cute.local_tile(mC, self.tile, (bm, bn, None), proj=(1, 1, None))
        tAsA, tAgA = cpasync.tma_partition(tma_a, 0, cute.make_layout(1),
                                           cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2))
        tBsB, tBgB = cpasync.tma_partition(tma_b, 0, cute.make_layout(1),
                                           cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2))
        thr_mma = tiled_mma.get_slice(tidx)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
        tCgC = thr_mma.partition_C(gC)
        cC = thr_mma.partition_C(cute.local_tile(cute.make_identity_tensor(mC.shape), self.tile,
                                                 (bm, bn, None), proj=(1, 1, None)))
        acc = cute.make_rmem_tensor(tCgC.shape, Float32)
        acc.fill(0.0)
        k_tiles = cute.size(gA, mode=[2])
        prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        cons = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        if warp == 0:
            for _ in cutlass.range(cutlass.min(self.stages, k_tiles), unroll=1):
                pipe.producer_acquire(prod)
                cute.copy(tma_a, tAgA[(None, prod.count)], tAsA[(None, prod.index)],
                          tma_bar_ptr=pipe.producer_get_barrier(prod))
                cute.copy(tma_b, tBgB[(None, prod.count)], tBsB[(None, prod.index)],
                          tma_bar_ptr=pipe.producer_get_barrier(prod))
                pipe.producer_commit(prod)
                prod.advance()
        tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
        for kt in cutlass.range(k_tiles, unroll=1):
            pipe.consumer_wait(cons)
            warpgroup.fence()
            for kb in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
                cute.gemm(tiled_mma, acc, tCrA[None, None, kb, cons.index], tCrB[None, None, kb, cons.index], acc)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            pipe.consumer_release(cons)
            cons.advance()
            if warp == 0 and prod.count < k_tiles:
                pipe.producer_acquire(prod)
                cute.copy(tma_a, tAgA[(None, prod.count)], tAsA[(None, prod.index)],
                          tma_bar_ptr=pipe.producer_get_barrier(prod))
                cute.copy(tma_b, tBgB[(None, prod.count)], tBsB[(None, prod.index)],
                          tma_bar_ptr=pipe.producer_get_barrier(prod))
                pipe.producer_commit(prod)
                prod.advance()
        for i in cutlass.range_constexpr(cute.size(acc)):
            if cute.elem_less(cC[i], mC.shape):
                tCgC[i] = acc[i].to(mC.element_type)


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _prepare(qkv_lora, q_b_weight, positions, cos_sin_cache, slot_mapping, kv_cache, arch=None):
    width, n = qkv_lora.shape[1], q_b_weight.shape[0]
    assert width == Q_RANK + KV_RANK + ROPE and n == HEADS * (NOPE + ROPE) and kv_cache.shape[-1] == KV_RANK + ROPE
    if "fns" not in _COMPILED:
        opts = f"--gpu-arch {arch or _arch()} --enable-tvm-ffi"
        stream = make_fake_stream(use_tvm_ffi_env_stream=True)
        bf = cutlass.BFloat16
        m = cute.sym_int()
        qkv = make_fake_compact_tensor(bf, (m, width), stride_order=(1, 0), assumed_align=16)
        q = make_fake_compact_tensor(bf, (m, n), stride_order=(1, 0), assumed_align=16)
        idx = make_fake_compact_tensor(cutlass.Int64, (m,))
        gemm = cute.compile(Gemm(Q_RANK), qkv,
                            make_fake_compact_tensor(bf, (n, Q_RANK), stride_order=(1, 0), assumed_align=16),
                            q, stream, options=opts)
        rope = cute.compile(RopeCache(), q, qkv, idx,
                            make_fake_compact_tensor(bf, (cute.sym_int(), ROPE), stride_order=(1, 0)), idx,
                            make_fake_compact_tensor(bf, (cute.sym_int(), KV_RANK + ROPE), stride_order=(1, 0)),
                            stream, options=opts)
        _COMPILED["fns"] = (gemm, rope)
    return list(_COMPILED["fns"])


def solve(qkv_lora, q_b_weight, positions, cos_sin_cache, slot_mapping, kv_cache):
    gemm, rope = _prepare(qkv_lora, q_b_weight, positions, cos_sin_cache, slot_mapping, kv_cache)
    tokens = qkv_lora.shape[0]
    q = torch.empty(tokens, HEADS * (NOPE + ROPE), dtype=qkv_lora.dtype, device=qkv_lora.device)
    gemm(qkv_lora, q_b_weight, q)
    rope(q, qkv_lora, positions, cos_sin_cache, slot_mapping, kv_cache.view(-1, kv_cache.shape[-1]))
    return q.view(tokens, HEADS, NOPE + ROPE)
