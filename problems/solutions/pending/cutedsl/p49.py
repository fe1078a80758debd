"""p49 group-limited top-8 MoE routing (Ring-flash-2.0) in CuTe DSL: one kernel, the routing in the GEMM's epilogue.

Replacement of the shipped two-kernel solution (speed, #20's expert bar).  A CTA owns 128 tokens and all
256 experts, so the logits never leave the SM:
Mainloop (warp-specialised): warp 0 issues the TMA loads of A (128 x 64 of hidden) and B (2 x 128 x 64 of
the gate weight) into a 4-stage full/empty mbarrier ring (48 KB a stage); two consumer warpgroups
(setmaxnreg 40 / 232) each own 64 tokens x 256 experts as two m64n128 fp32 accumulators.  Per 64-wide K
block and per 128-expert half: four WGMMA m64n128k16 into a zeroed scratch fragment, wait, one
round-to-nearest fp32 add into the accumulator -- the shipped kernel's per-block promotion, so every
logit is the same fp32 sum in the same order (tests/p49_model.py, tests/test_p49_numerics.py).
Epilogue, from registers: a row's 256 logits sit in the 4 lanes of a quad (8 per lane per group of 32).
Selection scores s + bias with s an fp32 sigmoid (ex2.approx / rcp.approx; error ~1e-7, the problem
redraws every decision to a margin >= 1e-4); group score = top-2 sum (quad butterfly), the 4 best groups
(ties: lower group).  Every value >= L = min over kept groups of their 2nd best is a candidate (at least
8 of them, the top-8 among them); the quad writes its candidates (score, expert, logit) to shared memory
(the pipeline's buffers, after a named barrier), each lane ranks its own (score, then lower index) and a
rank < 8 writes the int64 index.  Weights exactly as shipped: fp64 sigmoid of the winner's fp32 logit,
fp64 sum in choice order, / (sum + 1e-20) * scale, one rounding to fp32.  Dropped groups' experts score
0.0 in the reference; a 0.0 inside the top-8 would tie with the 9th (another 0.0), which the margin
redraw excludes, so they are never candidates.  Torch only allocates the outputs.
"""
import math

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
EXPERTS = 256
TILE_M, HALF_N = 128, 128          # CTA: 128 tokens x 256 experts, as two 128-expert halves
STAGES = 4                         # 4 x (16 KB of A + 32 KB of B)
THREADS = 384                      # producer warpgroup + two consumer warpgroups
CONSUMER_WARPS = 8
PRODUCER_REGS, CONSUMER_REGS = 40, 232
CAND = 128                         # candidate slots per token: 4 lanes x 32 (a lane's values in kept groups)
LOG2E = 1.4426950408889634
NEG_INF = float("-inf")


class RouterGemm:
    """indices, weights of the group-limited top-8 from logits = A(M,K) @ B(256,K)^T, one CTA per 128 tokens."""

    def __init__(self, scale: float):
        self.scale = scale

    @cute.jit
    def __call__(self, mA: cute.Tensor, mB: cute.Tensor, mBias: cute.Tensor, mIdx: cute.Tensor,
                 mW: cute.Tensor, stream):
        bf = mA.element_type
        a_l, b_l = utils.LayoutEnum.from_tensor(mA), utils.LayoutEnum.from_tensor(mB)
        tiled_mma = sm90_utils.make_trivial_tiled_mma(
            bf, bf, a_l.sm90_mma_major_mode(), b_l.sm90_mma_major_mode(), Float32, (2, 1, 1),
            tiler_mn=(64, HALF_N))                                   # two warpgroups stacked along M
        bk = cute.size(tiled_mma.shape_mnk, mode=[2]) * 4          # 4 x k16 = one promotion block of 64
        tile = (TILE_M, HALF_N, bk)
        sA_l = sm90_utils.make_smem_layout_a(a_l, tile, bf, STAGES)
        sB_l = sm90_utils.make_smem_layout_b(b_l, tile, bf, 2 * STAGES)   # stage s: halves 2s and 2s + 1
        tma_a, gA_tma = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mA,
                                                    cute.slice_(sA_l, (None, None, 0)), (TILE_M, bk))
        tma_b, gB_tma = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mB,
                                                    cute.slice_(sB_l, (None, None, 0)), (HALF_N, bk))

        @cute.struct
        class Smem:
            mbar: cute.struct.MemRange[cutlass.Int64, STAGES * 2]
            cnt: cute.struct.MemRange[Int32, TILE_M * 4]
            sel: cute.struct.MemRange[Float32, TILE_M * TOP_K]
            sco: cute.struct.Align[cute.struct.MemRange[Float64, TILE_M * TOP_K], 16]
            sA: cute.struct.Align[cute.struct.MemRange[bf, cute.cosize(sA_l)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[bf, cute.cosize(sB_l)], 1024]
        self.smem_t = Smem
        self.ab_dtype = bf
        self.bk = bk
        self.kernel(tma_a, gA_tma, tma_b, gB_tma, mBias, mIdx, mW, tiled_mma, sA_l, sB_l).launch(
            grid=[cute.ceil_div(mIdx.shape[0], TILE_M), 1, 1], block=[THREADS, 1, 1], min_blocks_per_mp=1,
            stream=stream)

    @cute.kernel
    def kernel(self, tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom, mB: cute.Tensor,
               mBias: cute.Tensor, mIdx: cute.Tensor, mW: cute.Tensor, tiled_mma: cute.TiledMma,
               sA_l: cute.ComposedLayout, sB_l: cute.ComposedLayout):
        tidx, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp == 0:
            cpasync.prefetch_descriptor(tma_a)
            cpasync.prefetch_descriptor(tma_b)
        storage = cutlass.utils.SmemAllocator().allocate(self.smem_t)
        tx_bytes = cute.size_in_bytes(self.ab_dtype, cute.slice_(sA_l, (None, None, 0))) + \
            2 * cute.size_in_bytes(self.ab_dtype, cute.slice_(sB_l, (None, None, 0)))
        pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar.data_ptr(), num_stages=STAGES,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, CONSUMER_WARPS),
            tx_count=tx_bytes, cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)))
        sA = storage.sA.get_tensor(sA_l.outer, swizzle=sA_l.inner)
        sB = storage.sB.get_tensor(sB_l.outer, swizzle=sB_l.inner)
        gA = cute.local_tile(mA, (TILE_M, self.bk), (None, None))        # (128, 64, m tiles, k tiles)
        gB = cute.local_tile(mB, (HALF_N, self.bk), (None, None))        # (128, 64, 2, k tiles)
        k_tiles = cute.size(gA, mode=[3])
        if warp < 4:                                                     # producer warpgroup
            cute.arch.setmaxregister_decrease(PRODUCER_REGS)
            if warp == 0:
                tAsA, tAgA = cpasync.tma_partition(tma_a, 0, cute.make_layout(1),
                                                   cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2))
                tBsB, tBgB = cpasync.tma_partition(tma_b, 0, cute.make_layout(1),
                                                   cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2))
                prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, STAGES)
                for kt in cutlass.range(k_tiles, unroll=1):
                    pipe.producer_acquire(prod)
                    bar = pipe.producer_get_barrier(prod)
                    cute.copy(tma_a, tAgA[(None, bid, kt)], tAsA[(None, prod.index)], tma_bar_ptr=bar)
                    cute.copy(tma_b, tBgB[(None, 0, kt)], tBsB[(None, 2 * prod.index)], tma_bar_ptr=bar)
                    cute.copy(tma_b, tBgB[(None, 1, kt)], tBsB[(None, 2 * prod.index + 1)], tma_bar_ptr=bar)
                    pipe.producer_commit(prod)
                    prod.advance()
                pipe.producer_tail(prod)
        else:                                                            # two consumer warpgroups
            cute.arch.setmaxregister_increase(CONSUMER_REGS)
            thr_mma = tiled_mma.get_slice(tidx - 128)
            tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
            tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
            cT = thr_mma.partition_C(cute.make_identity_tensor((TILE_M, HALF_N)))
            _check_fragment(cT)
            acc0 = cute.make_rmem_tensor(cT.shape, Float32)              # experts 0..127
            acc1 = cute.make_rmem_tensor(cT.shape, Float32)              # experts 128..255
            tmp = cute.make_rmem_tensor(cT.shape, Float32)
            acc0.fill(0.0)
            acc1.fill(0.0)
            cons = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, STAGES)
            for kt in cutlass.range(k_tiles, unroll=1):
                pipe.consumer_wait(cons)
                s = cons.index
                tiled_mma.set(warpgroup.Field.ACCUMULATE, False)     # a fresh partial sum per K block
                warpgroup.fence()
                for kb in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
                    cute.gemm(tiled_mma, tmp, tCrA[None, None, kb, s], tCrB[None, None, kb, 2 * s], tmp)
                    tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
                warpgroup.commit_group()
                warpgroup.wait_group(0)
                for i in cutlass.range_constexpr(cute.size(acc0)):       # promotion: one fp32 add per block
                    acc0[i] = acc0[i] + tmp[i]
                tiled_mma.set(warpgroup.Field.ACCUMULATE, False)
                warpgroup.fence()
                for kb in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
                    cute.gemm(tiled_mma, tmp, tCrA[None, None, kb, s], tCrB[None, None, kb, 2 * s + 1], tmp)
                    tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
                warpgroup.commit_group()
                warpgroup.wait_group(0)
                pipe.consumer_release(cons)
                cons.advance()
                for i in cutlass.range_constexpr(cute.size(acc1)):
                    acc1[i] = acc1[i] + tmp[i]
            # both warpgroups' WGMMAs have read their last stage before its bytes become routing scratch
            cute.arch.barrier(barrier_id=1, number_of_threads=256)
            self.route(acc0, acc1, cT[0][0], cT[0][1], bid, storage, mBias, mIdx, mW)

    def score(self, x: Float32, mBias: cute.Tensor, e: Int32) -> Float32:
        """Selection score sigmoid(x) + bias[e] in fp32 (fast sigmoid: used for comparisons only)."""
        z = cute.math.exp2(x * Float32(-LOG2E), fastmath=True)
        return cute.arch.rcp_approx(Float32(1.0) + z) + mBias[e].to(Float32)

    @cute.jit
    def route(self, acc0: cute.Tensor, acc1: cute.Tensor, r0: Int32, c0: Int32, bid: Int32, storage,
              mBias: cute.Tensor, mIdx: cute.Tensor, mW: cute.Tensor):
        """The group-limited top-8 of this thread's two rows (r0, r0 + 8), a quad of lanes per row."""
        candV = storage.sB.get_tensor(cute.make_layout((TILE_M, CAND), stride=(CAND, 1)), dtype=Float32)
        candL = storage.sB.get_tensor(cute.make_layout((TILE_M, CAND), stride=(CAND, 1)), dtype=Float32)
        candL = cute.make_tensor(candL.iterator + TILE_M * CAND, candL.layout)
        candI = storage.sA.get_tensor(cute.make_layout((TILE_M, CAND), stride=(CAND, 1)), dtype=Int32)
        cnt = storage.cnt.get_tensor(cute.make_layout((TILE_M, 4), stride=(4, 1)))
        sel = storage.sel.get_tensor(cute.make_layout((TILE_M, TOP_K), stride=(TOP_K, 1)))
        sco = storage.sco.get_tensor(cute.make_layout((TILE_M, TOP_K), stride=(TOP_K, 1)))
        q = c0 // 2
        tokens = mIdx.shape[0]
        gs = cute.make_rmem_tensor((N_GROUP,), Float32)
        g2 = cute.make_rmem_tensor((N_GROUP,), Float32)
        kept = cute.make_rmem_tensor((N_GROUP,), Int32)
        for h in cutlass.range_constexpr(2):
            rl = r0 + 8 * h
            row = bid * TILE_M + rl
            for g in cutlass.range_constexpr(N_GROUP):                  # group scores: top-2 sums
                t1 = Float32(NEG_INF)
                t2 = Float32(NEG_INF)
                for cc in cutlass.range_constexpr(4):
                    for j in cutlass.range_constexpr(2):
                        i = j + 2 * h + 4 * (4 * (g % 4) + cc)
                        x = acc0[i] if cutlass.const_expr(g < 4) else acc1[i]
                        v = self.score(x, mBias, HALF_N * (g // 4) + 8 * (4 * (g % 4) + cc) + c0 + j)
                        t2 = cute.arch.fmax(t2, cute.arch.fmin(t1, v))
                        t1 = cute.arch.fmax(t1, v)
                for sh in cutlass.range_constexpr(2):
                    o1 = cute.arch.shuffle_sync_bfly(t1, offset=1 << sh)
                    o2 = cute.arch.shuffle_sync_bfly(t2, offset=1 << sh)
                    t2 = cute.arch.fmax(cute.arch.fmin(t1, o1), cute.arch.fmax(t2, o2))
                    t1 = cute.arch.fmax(t1, o1)
                gs[g] = t1 + t2
                g2[g] = t2
            lo = Float32(float("inf"))
            for g in cutlass.range_constexpr(N_GROUP):                  # the 4 best groups (ties: lower group)
                rank = Int32(0)
                for o in cutlass.range_constexpr(N_GROUP):
                    if cutlass.const_expr(o < g):
                        if gs[o] >= gs[g]:
                            rank = rank + 1
                    elif cutlass.const_expr(o > g):
                        if gs[o] > gs[g]:
                            rank = rank + 1
                kept[g] = Int32(0)
                if rank < TOPK_GROUP:
                    kept[g] = Int32(1)
                    lo = cute.arch.fmin(lo, g2[g])
            n_own = Int32(0)                                             # candidates: kept values >= lo
            for g in cutlass.range_constexpr(N_GROUP):
                if kept[g] != 0:
                    for cc in cutlass.range_constexpr(4):
                        for j in cutlass.range_constexpr(2):
                            i = j + 2 * h + 4 * (4 * (g % 4) + cc)
                            x = acc0[i] if cutlass.const_expr(g < 4) else acc1[i]
                            e = HALF_N * (g // 4) + 8 * (4 * (g % 4) + cc) + c0 + j
                            v = self.score(x, mBias, e)
                            if v >= lo:
                                candV[rl, q * 32 + n_own] = v
                                candL[rl, q * 32 + n_own] = x
                                candI[rl, q * 32 + n_own] = e
                                n_own = n_own + 1
            cnt[rl, q] = n_own
            cute.arch.sync_warp()
            for k in cutlass.range(n_own, unroll=1):                     # rank own candidates in the quad's
                v = candV[rl, q * 32 + k]
                e = candI[rl, q * 32 + k]
                rank = Int32(0)
                for o in cutlass.range_constexpr(4):
                    for m in cutlass.range(cnt[rl, o], unroll=1):
                        ov = candV[rl, o * 32 + m]
                        oi = candI[rl, o * 32 + m]
                        if ov > v or (ov == v and oi < e):
                            rank = rank + 1
                if rank < TOP_K:
                    sel[rl, rank] = candL[rl, q * 32 + k]
                    if row < tokens:
                        mIdx[row, rank] = Int64(e)
            cute.arch.sync_warp()
            for u in cutlass.range_constexpr(2):                         # weights in fp64, as shipped
                k = 2 * q + u
                sco[rl, k] = 1.0 / (1.0 + cute.math.exp(-Float64(sel[rl, k])))
            cute.arch.sync_warp()
            ssum = Float64(0.0)
            for k in cutlass.range_constexpr(TOP_K):
                ssum = ssum + sco[rl, k]
            if row < tokens:
                for u in cutlass.range_constexpr(2):
                    k = 2 * q + u
                    mW[row, k] = Float32(sco[rl, k] / (ssum + 1e-20) * self.scale)
            cute.arch.sync_warp()


def _check_fragment(cT):
    """The epilogue indexes the accumulators by position: element i = j + 2h + 4c of a thread's m64n128
    fragment sits at tile row r0 + 8h, column c0 + 8c + j, c0 = 2 (lane % 4) (checked while tracing)."""
    if str(cT.layout) != "((2,2,16),1,1):((1@1,8@0,8@1),0,0)":
        raise ValueError(f"unexpected WGMMA accumulator layout {cT.layout}")


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _prepare(hidden_states, gate_weight, expert_bias, routed_scaling_factor, arch=None):
    hidden = hidden_states.shape[1]
    experts = gate_weight.shape[0]
    assert experts == EXPERTS and hidden % 64 == 0, (hidden_states.shape, gate_weight.shape)
    key = (hidden, float(routed_scaling_factor))
    if key not in _COMPILED:
        assert math.isfinite(float(routed_scaling_factor))
        opts = f"--gpu-arch {arch or _arch()} --enable-tvm-ffi"
        m = cute.sym_int()
        bf = cutlass.BFloat16
        _COMPILED[key] = cute.compile(
            RouterGemm(float(routed_scaling_factor)),
            make_fake_compact_tensor(bf, (m, hidden), stride_order=(1, 0), assumed_align=16),
            make_fake_compact_tensor(bf, (experts, hidden), stride_order=(1, 0), assumed_align=16),
            make_fake_compact_tensor(bf, (experts,), assumed_align=16),
            make_fake_compact_tensor(Int64, (m, TOP_K), stride_order=(1, 0)),
            make_fake_compact_tensor(Float32, (m, TOP_K), stride_order=(1, 0)),
            make_fake_stream(use_tvm_ffi_env_stream=True), options=opts)
    return [_COMPILED[key]]


def solve(hidden_states, gate_weight, expert_bias, routed_scaling_factor):
    (kernel,) = _prepare(hidden_states, gate_weight, expert_bias, routed_scaling_factor)
    tokens, dev = hidden_states.shape[0], hidden_states.device
    indices = torch.empty(tokens, TOP_K, dtype=torch.int64, device=dev)
    weights = torch.empty(tokens, TOP_K, dtype=torch.float32, device=dev)
    kernel(hidden_states, gate_weight, expert_bias, indices, weights)
    return indices, weights
