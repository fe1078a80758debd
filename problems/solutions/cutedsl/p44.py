"""p44 DeepSeek-V3 MoE layer on one EP rank (FP8 block-scaled SwiGLU experts), every step in CuTe DSL.

1. Routing, a warp per token: sigmoid (fp64, rounded once), + bias (bf16 read in the kernel), group
   score = top-2 sum per group of 32, top-4 groups, 8 rounds of a warp arg-max, weights
   fp32(s / sum s) * routed scale (the scale and the local offset are compile-time constants).
2. Dispatch, a CTA per local expert (no atomics, deterministic): count, then the expert's row offset in
   a gathered buffer whose segments are padded to the 64-row GEMM tile, the rows of its pairs in token
   order, the tile -> expert map; CTA 0 marks the other ranks' pairs (-1).
3. Gather: the fp8 rows of hidden_states and their 56 activation scales (block-major [56, T] input).
4. Decode: gemm2's e4m3 codes to bf16, exactly (the codes, not code * scale).
5. GEMM1, FP8 WGMMA m64n64k32 e4m3 x e4m3 -> fp32 over each expert's row segment (TMA, 4-stage mbarrier
   pipeline): a CTA computes 64 up and the matching 64 gate columns of its expert; each 128-wide K
   block goes into scratch accumulators that are promoted into fp32 with x_scale[row] * w_scale
   (per-block promotion); epilogue a = silu(gate) * up in fp32, rounded to bf16 (the GEMM2 operand).
6. GEMM2, bf16 WGMMA m64n128k16 over the decoded codes, each 64-wide K tile promoted with its
   128x128 block scale; y in fp32.
7. Combine, a CTA per token: out = sum of weight * y over the token's local experts, fp32, one bf16
   rounding (tokens without a local expert get 0).
"""
import torch

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Float64, Int32
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

N_GROUP, TOPK_GROUP, TOP_K = 8, 4, 8
BLOCK = 128         # scale block
BM = 64             # GEMM m-tile = padding of each expert's row segment
NEG_INF = float("-inf")


class Router:
    """One warp per token: sigmoid, + bias, group-limited top-8, weights (lane l: experts 8l..8l+7)."""

    def __init__(self, experts: int, scale: float):
        assert experts == 256
        self.scale = scale

    @cute.jit
    def __call__(self, logits: cute.Tensor, bias: cute.Tensor, idx_out: cute.Tensor, w_out: cute.Tensor, stream):
        self.kernel(logits, bias, idx_out, w_out).launch(grid=[(logits.shape[0] + 3) // 4, 1, 1],
                                                         block=[128, 1, 1], stream=stream)

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
            sc = cute.make_rmem_tensor((8,), Float32)
            val = cute.make_rmem_tensor((8,), Float32)
            t1 = Float32(NEG_INF)
            t2 = Float32(NEG_INF)
            for e in cutlass.range_constexpr(8):
                sc[e] = Float32(1.0 / (1.0 + cute.math.exp(-Float64(rl[e]))))
                val[e] = sc[e] + rb[e].to(Float32)
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
            if rank >= TOPK_GROUP:
                for e in cutlass.range_constexpr(8):
                    val[e] = Float32(NEG_INF)
            my_idx = Int32(0)
            my_s = Float32(0.0)
            ssum = Float64(0.0)
            for k in cutlass.range_constexpr(TOP_K):
                bv = Float32(NEG_INF)
                bi = Int32(1 << 30)
                bs = Float32(0.0)
                for e in cutlass.range_constexpr(8):
                    if val[e] > bv:
                        bv = val[e]
                        bi = lane * 8 + e
                        bs = sc[e]
                for sh in cutlass.range_constexpr(5):
                    ov = cute.arch.shuffle_sync_bfly(bv, offset=1 << sh)
                    oi = cute.arch.shuffle_sync_bfly(bi, offset=1 << sh)
                    os_ = cute.arch.shuffle_sync_bfly(bs, offset=1 << sh)
                    if ov > bv or (ov == bv and oi < bi):
                        bv = ov
                        bi = oi
                        bs = os_
                for e in cutlass.range_constexpr(8):
                    if bi == lane * 8 + e:
                        val[e] = Float32(NEG_INF)
                ssum = ssum + Float64(bs)
                if lane == k:
                    my_idx = bi
                    my_s = bs
            if lane < TOP_K:
                idx_out[t, lane] = my_idx
                w_out[t, lane] = Float32(Float64(my_s) / ssum) * Float32(self.scale)


class Dispatch:
    """A CTA per local expert.  count: its number of pairs.  scatter: its row offset (segments padded to BM
    rows), the gathered row of each of its pairs in flat (token, choice) order (-1 for other ranks'
    experts, written by CTA 0), the token of each row (-1 on padding), the expert of each row block
    (-1 past the last segment)."""

    def __init__(self, scatter: bool, offset: int):
        self.scatter, self.offset = scatter, offset

    @cute.jit
    def __call__(self, ids, counts, row_of, tok_of, tiles, stream):
        self.kernel(ids, counts, row_of, tok_of, tiles).launch(grid=[counts.shape[0], 1, 1], block=[256, 1, 1],
                                                               stream=stream)

    @cute.kernel
    def kernel(self, ids: cute.Tensor, counts: cute.Tensor, row_of: cute.Tensor, tok_of: cute.Tensor,
               tiles: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        e, _, _ = cute.arch.block_idx()
        n = ids.shape[0]
        nloc = counts.shape[0]
        mine = e + self.offset
        chunk = (n + 255) // 256                     # thread tidx scans flat pairs [lo, hi) in order
        lo = cutlass.min(tidx * chunk, n)
        hi = cutlass.min(lo + chunk, n)
        sm = cutlass.utils.SmemAllocator().allocate_tensor(Int32, cute.make_layout(258))
        c = Int32(0)
        for i in cutlass.range(lo, hi, unroll=1):
            if ids[i] == mine:
                c = c + 1
        sm[tidx] = c
        cute.arch.sync_threads()
        if tidx == 0:                                # exclusive scan of the 256 counts; the padded offset
            run = Int32(0)
            for j in cutlass.range(256, unroll=1):
                cj = sm[j]
                sm[j] = run
                run = run + cj
            sm[256] = run
            off = Int32(0)
            if cutlass.const_expr(self.scatter):
                for e2 in cutlass.range(e, unroll=1):
                    off = off + (counts[e2] + BM - 1) // BM * BM
            sm[257] = off
        cute.arch.sync_threads()
        total = sm[256]
        if cutlass.const_expr(not self.scatter):
            if tidx == 0:
                counts[e] = total
        else:
            off = sm[257]
            row = off + sm[tidx]
            for i in cutlass.range(lo, hi, unroll=1):
                v = ids[i]
                if v == mine:
                    row_of[i] = row
                    tok_of[row] = i // TOP_K
                    row = row + 1
                elif e == 0 and (v < self.offset or v >= self.offset + nloc):
                    row_of[i] = Int32(-1)
            end = off + (total + BM - 1) // BM * BM
            for r in cutlass.range(off + total + tidx, end, 256, unroll=1):
                tok_of[r] = Int32(-1)
            for b in cutlass.range(off // BM + tidx, end // BM, 256, unroll=1):
                tiles[b] = e
            if e == nloc - 1:                        # past the last segment: no rows, no tiles
                for r in cutlass.range(end + tidx, tok_of.shape[0], 256, unroll=1):
                    tok_of[r] = Int32(-1)
                for b in cutlass.range(end // BM + tidx, tiles.shape[0], 256, unroll=1):
                    tiles[b] = Int32(-1)


class Gather:
    """xg[row] = hidden_states[tok_of[row]] (16-byte copies), sag[row, kb] = hidden_states_scale[kb, tok];
    padding rows untouched (the GEMMs are row-independent and the combine never reads them)."""

    def __init__(self, hidden: int):
        self.nv, self.kb = hidden // 16, hidden // BLOCK

    @cute.jit
    def __call__(self, x, xs, tok_of, xg, sag, stream):
        self.kernel(x, xs, tok_of, xg, sag).launch(grid=[xg.shape[0], 1, 1], block=[128, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, x: cute.Tensor, xs: cute.Tensor, tok_of: cute.Tensor, xg: cute.Tensor, sag: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        tok = tok_of[row]
        if tok >= 0:
            r = cute.make_rmem_tensor((16,), x.element_type)
            for v in cutlass.range(tidx, self.nv, 128, unroll=1):
                cute.autovec_copy(cute.zipped_divide(x[tok, None], (16,))[None, v], r)
                cute.autovec_copy(r, cute.zipped_divide(xg[row, None], (16,))[None, v])
            for kb in cutlass.range(tidx, self.kb, 128, unroll=1):
                sag[row, kb] = xs[kb, tok]


class Decode:
    """w16[i] = bf16(e4m3 code w8[i]) (exact: e4m3 -> f16 -> f32 -> bf16), 16 codes a thread, grid-stride."""

    @cute.jit
    def __call__(self, w8: cute.Tensor, w16: cute.Tensor, stream):
        codes = cute.make_tensor(cute.recast_ptr(w8.iterator, dtype=cutlass.Float8E4M3FN), w8.layout)
        self.kernel(codes, w16).launch(grid=[132 * 16, 1, 1], block=[256, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, codes: cute.Tensor, w16: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        rin = cute.make_rmem_tensor((16,), cutlass.Float8E4M3FN)
        rout = cute.make_rmem_tensor((16,), w16.element_type)
        for v in cutlass.range(bidx * 256 + tidx, codes.shape[0] // 16, 132 * 16 * 256, unroll=1):
            cute.autovec_copy(cute.zipped_divide(codes, (16,))[None, v], rin)
            rout.store(rin.load().to(Float32).to(w16.element_type))
            cute.autovec_copy(rout, cute.zipped_divide(w16, (16,))[None, v])


class GroupedGemm:
    """Per expert row segment (e = tiles[row block]), with per-block scale promotion:
    fp8=True:  C (R, NH) = silu(A Bg^T) * (A Bu^T), A (R, K) e4m3 with scales SA (R, K/128), B[e] = [Bu; Bg]
               (N = 2 NH, K) e4m3 with scales SB[e] (N/128, K/128); bf16 out.
    fp8=False: C (R, N) = A B[e]^T, A bf16, B[e] bf16 codes with scales SB[e] (N/128, K/128); fp32 out."""

    def __init__(self, fp8: bool, stages: int = 4):
        self.fp8, self.stages = fp8, stages
        self.bn = 64 if fp8 else 128

    @cute.jit
    def __call__(self, mA0: cute.Tensor, mSA: cute.Tensor, mB0: cute.Tensor, mSB: cute.Tensor, mTiles: cute.Tensor,
                 mC: cute.Tensor, stream):
        mA, mB = mA0, mB0
        if cutlass.const_expr(self.fp8):
            f8 = cutlass.Float8E4M3FN
            mA = cute.make_tensor(cute.recast_ptr(mA0.iterator, dtype=f8), mA0.layout)
            mB = cute.make_tensor(cute.recast_ptr(mB0.iterator, dtype=f8), mB0.layout)
        a_l, b_l = utils.LayoutEnum.from_tensor(mA), utils.LayoutEnum.from_tensor(mB)
        tiled_mma = sm90_utils.make_trivial_tiled_mma(
            mA.element_type, mB.element_type, a_l.sm90_mma_major_mode(), b_l.sm90_mma_major_mode(), Float32,
            (1, 1, 1), tiler_mn=(64, self.bn))
        bk = cute.size(tiled_mma.shape_mnk, mode=[2]) * 4       # fp8: 4 x k32 = 128; bf16: 4 x k16 = 64
        tile = (BM, self.bn, bk)
        sA_l = sm90_utils.make_smem_layout_a(a_l, tile, mA.element_type, self.stages)
        sB_l = sm90_utils.make_smem_layout_b(b_l, tile, mB.element_type, self.stages)
        op = cpasync.CopyBulkTensorTileG2SOp()
        tma_a, gA = cpasync.make_tiled_tma_atom(op, mA, cute.slice_(sA_l, (None, None, 0)), (BM, bk))
        tma_b, gB = cpasync.make_tiled_tma_atom(op, mB, cute.slice_(sB_l, (None, None, 0)), (self.bn, bk))
        nb = 2 if self.fp8 else 1

        @cute.struct
        class Smem:
            mbar: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            sA: cute.struct.Align[cute.struct.MemRange[mA.element_type, cute.cosize(sA_l)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[mB.element_type, cute.cosize(sB_l) * nb], 1024]
        self.smem_t = Smem
        self.ab_dtype = mA.element_type
        self.tile = tile
        grid = (cute.ceil_div(mC.shape[1], self.bn), cute.ceil_div(mC.shape[0], BM), 1)   # N tiles fastest
        self.kernel(tma_a, gA, tma_b, gB, mSA, mSB, mTiles, mC, tiled_mma, sA_l, sB_l).launch(
            grid=grid, block=[128, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom, mB: cute.Tensor, mSA: cute.Tensor,
               mSB: cute.Tensor, mTiles: cute.Tensor, mC: cute.Tensor, tiled_mma: cute.TiledMma,
               sA_l: cute.ComposedLayout, sB_l: cute.ComposedLayout):
        tidx, _, _ = cute.arch.thread_idx()
        bn, bm, _ = cute.arch.block_idx()
        e = mTiles[bm]
        if e >= 0:
            warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
            if warp == 0:
                cpasync.prefetch_descriptor(tma_a)
                cpasync.prefetch_descriptor(tma_b)
            storage = cutlass.utils.SmemAllocator().allocate(self.smem_t)
            b_bytes = cute.size_in_bytes(self.ab_dtype, cute.slice_(sB_l, (None, None, 0)))
            tx_bytes = cute.size_in_bytes(self.ab_dtype, cute.slice_(sA_l, (None, None, 0))) + b_bytes * (
                2 if self.fp8 else 1)
            pipe = pipeline.PipelineTmaAsync.create(
                barrier_storage=storage.mbar.data_ptr(), num_stages=self.stages,
                producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
                consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 4),
                tx_count=tx_bytes, cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)))
            sA = storage.sA.get_tensor(sA_l.outer, swizzle=sA_l.inner)
            sB = storage.sB.get_tensor(sB_l.outer, swizzle=sB_l.inner)
            sB2 = cute.make_tensor(sB.iterator + cute.cosize(sB_l.outer), sB.layout)
            half = mC.shape[1]                       # fp8: the gate rows of B start at row NH = C's width
            gA = cute.local_tile(mA, self.tile, (bm, bn, None), proj=(1, None, 1))
            gB = cute.local_tile(mB[None, None, e], self.tile, (bm, bn, None), proj=(None, 1, 1))
            gB2 = cute.local_tile(mB[None, None, e], self.tile, (bm, bn + half // self.bn, None), proj=(None, 1, 1))
            gC = cute.local_tile(mC, self.tile, (bm, bn, None), proj=(1, 1, None))
            tAsA, tAgA = cpasync.tma_partition(tma_a, 0, cute.make_layout(1),
                                               cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2))
            tBsB, tBgB = cpasync.tma_partition(tma_b, 0, cute.make_layout(1),
                                               cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2))
            tBsB2, tBgB2 = cpasync.tma_partition(tma_b, 0, cute.make_layout(1),
                                                 cute.group_modes(sB2, 0, 2), cute.group_modes(gB2, 0, 2))
            thr_mma = tiled_mma.get_slice(tidx)
            tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
            tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
            tCrB2 = tiled_mma.make_fragment_B(thr_mma.partition_B(sB2))
            tCgC = thr_mma.partition_C(gC)
            cC = thr_mma.partition_C(cute.local_tile(cute.make_identity_tensor(mC.shape), self.tile,
                                                     (bm, bn, None), proj=(1, 1, None)))
            acc = cute.make_rmem_tensor(tCgC.shape, Float32)
            tmp = cute.make_rmem_tensor(tCgC.shape, Float32)
            acc2 = cute.make_rmem_tensor(tCgC.shape, Float32)
            tmp2 = cute.make_rmem_tensor(tCgC.shape, Float32)
            acc.fill(0.0)
            acc2.fill(0.0)
            # this thread's two accumulator rows (m64 fragments: rows r0 and r0 + 8); R is a multiple of BM
            r0 = cutlass.min(cutlass.min(cC[0][0], cC[1][0]), cutlass.min(cC[2][0], cC[3][0]))
            nblk = bn * self.bn // BLOCK             # the 128-row scale block of B holding this tile
            nblk2 = (half + bn * self.bn) // BLOCK
            k_tiles = cute.size(gA, mode=[2])
            prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
            cons = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
            if warp == 0:
                for _ in cutlass.range(cutlass.min(self.stages, k_tiles), unroll=1):
                    self.load(pipe, prod, tma_a, tAgA, tAsA, tma_b, tBgB, tBsB, tBgB2, tBsB2)
                    prod.advance()
            for kt in cutlass.range(k_tiles, unroll=1):
                s0 = Float32(0.0)
                s1 = Float32(0.0)
                g0 = Float32(0.0)
                g1 = Float32(0.0)
                if cutlass.const_expr(self.fp8):     # K tile = scale block kt
                    sbu = mSB[e, nblk, kt]
                    sbg = mSB[e, nblk2, kt]
                    xa = mSA[r0, kt]
                    xb = mSA[r0 + 8, kt]
                    s0 = xa * sbu
                    s1 = xb * sbu
                    g0 = xa * sbg
                    g1 = xb * sbg
                else:                                # K tile = half a scale block
                    s0 = mSB[e, nblk, kt // 2]
                    s1 = s0
                pipe.consumer_wait(cons)
                tiled_mma.set(warpgroup.Field.ACCUMULATE, False)
                warpgroup.fence()
                for kb in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
                    a_kb = tCrA[None, None, kb, cons.index]
                    cute.gemm(tiled_mma, tmp, a_kb, tCrB[None, None, kb, cons.index], tmp)
                    if cutlass.const_expr(self.fp8):
                        cute.gemm(tiled_mma, tmp2, a_kb, tCrB2[None, None, kb, cons.index], tmp2)
                    tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
                warpgroup.commit_group()
                warpgroup.wait_group(0)
                pipe.consumer_release(cons)
                cons.advance()
                if warp == 0 and prod.count < k_tiles:
                    self.load(pipe, prod, tma_a, tAgA, tAsA, tma_b, tBgB, tBsB, tBgB2, tBsB2)
                    prod.advance()
                for i in cutlass.range_constexpr(cute.size(acc)):
                    su = s1
                    sg = g1
                    if cC[i][0] == r0:
                        su = s0
                        sg = g0
                    acc[i] = acc[i] + tmp[i] * su
                    if cutlass.const_expr(self.fp8):
                        acc2[i] = acc2[i] + tmp2[i] * sg
            for i in cutlass.range_constexpr(cute.size(acc)):
                if cute.elem_less(cC[i], mC.shape):
                    if cutlass.const_expr(self.fp8):
                        g = acc2[i]
                        tCgC[i] = (g / (1.0 + cute.math.exp(-g)) * acc[i]).to(mC.element_type)
                    else:
                        tCgC[i] = acc[i].to(mC.element_type)

    @cute.jit
    def load(self, pipe, prod, tma_a, tAgA, tAsA, tma_b, tBgB, tBsB, tBgB2, tBsB2):
        pipe.producer_acquire(prod)
        bar = pipe.producer_get_barrier(prod)
        cute.copy(tma_a, tAgA[(None, prod.count)], tAsA[(None, prod.index)], tma_bar_ptr=bar)
        cute.copy(tma_b, tBgB[(None, prod.count)], tBsB[(None, prod.index)], tma_bar_ptr=bar)
        if cutlass.const_expr(self.fp8):
            cute.copy(tma_b, tBgB2[(None, prod.count)], tBsB2[(None, prod.index)], tma_bar_ptr=bar)
        pipe.producer_commit(prod)


class Combine:
    """out[t] = sum over t's local pairs j of w[t, j] * y[row_of[t, j]], fp32, one bf16 rounding; a CTA per token."""

    def __init__(self, hidden: int):
        self.nv = hidden // 4

    @cute.jit
    def __call__(self, y, row_of, w, out, stream):
        self.kernel(y, row_of, w, out).launch(grid=[out.shape[0], 1, 1], block=[128, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, y: cute.Tensor, row_of: cute.Tensor, w: cute.Tensor, out: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        t, _, _ = cute.arch.block_idx()
        rows = cute.make_rmem_tensor((TOP_K,), Int32)
        ws = cute.make_rmem_tensor((TOP_K,), Float32)
        for j in cutlass.range_constexpr(TOP_K):
            rows[j] = row_of[t * TOP_K + j]
            ws[j] = w[t, j]
        r = cute.make_rmem_tensor((4,), Float32)
        acc = cute.make_rmem_tensor((4,), Float32)
        o = cute.make_rmem_tensor((4,), out.element_type)
        for v in cutlass.range(tidx, self.nv, 128, unroll=1):
            for i in cutlass.range_constexpr(4):
                acc[i] = Float32(0.0)
            for j in cutlass.range_constexpr(TOP_K):
                if rows[j] >= 0:
                    cute.autovec_copy(cute.zipped_divide(y[rows[j], None], (4,))[None, v], r)
                    for i in cutlass.range_constexpr(4):
                        acc[i] = acc[i] + ws[j] * r[i]
            for i in cutlass.range_constexpr(4):
                o[i] = acc[i].to(out.element_type)
            cute.autovec_copy(o, cute.zipped_divide(out[t, None], (4,))[None, v])


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _rows(dtype, shape, align=16):
    return make_fake_compact_tensor(dtype, shape, stride_order=tuple(range(len(shape) - 1, -1, -1)),
                                    assumed_align=align)


def _experts(dtype, n, k, e):  # [E, N, K] weights as an (N, K, E) view
    return make_fake_compact_tensor(dtype, (n, k, e), stride_order=(1, 0, 2), assumed_align=16)


def _prepare(routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale,
             gemm2_weights, gemm2_weights_scale, local_expert_offset=32, routed_scaling_factor=2.5, arch=None):
    experts = routing_logits.shape[1]
    nloc, n1, d = gemm1_weights.shape
    f = n1 // 2
    assert d % BLOCK == 0 and f % BLOCK == 0 and experts == 256
    key = (experts, nloc, d, f, int(local_expert_offset), float(routed_scaling_factor))
    if key not in _COMPILED:
        opts = f"--gpu-arch {arch or _arch()} --enable-tvm-ffi"
        st = make_fake_stream(use_tvm_ffi_env_stream=True)
        t, r, n, nt = cute.sym_int(), cute.sym_int(), cute.sym_int(), cute.sym_int()
        nw = cute.sym_int(divisibility=16)
        u8, bf, i32 = cutlass.Uint8, cutlass.BFloat16, Int32
        ids, counts, row_of = _rows(i32, (n,)), _rows(i32, (nloc,)), _rows(i32, (n,))
        tok_of, tiles = _rows(i32, (r,)), _rows(i32, (nt,))
        xg, sag = _rows(u8, (r, d)), _rows(Float32, (r, d // BLOCK))
        act, y = _rows(bf, (r, f)), _rows(Float32, (r, d))
        _COMPILED[key] = (
            cute.compile(Router(experts, float(routed_scaling_factor)), _rows(Float32, (t, experts)),
                         _rows(bf, (experts,)), _rows(i32, (t, TOP_K), 4), _rows(Float32, (t, TOP_K), 4), st,
                         options=opts),
            cute.compile(Dispatch(False, int(local_expert_offset)), ids, counts, row_of, tok_of, tiles, st,
                         options=opts),
            cute.compile(Dispatch(True, int(local_expert_offset)), ids, counts, row_of, tok_of, tiles, st,
                         options=opts),
            cute.compile(Gather(d), _rows(u8, (t, d)), _rows(Float32, (d // BLOCK, t), 4), tok_of, xg, sag, st,
                         options=opts),
            cute.compile(Decode(), _rows(u8, (nw,)), _rows(bf, (nw,)), st, options=opts),
            cute.compile(GroupedGemm(True), xg, sag, _experts(u8, n1, d, nloc),
                         _rows(Float32, (nloc, n1 // BLOCK, d // BLOCK), 4), tiles, act, st, options=opts),
            cute.compile(GroupedGemm(False), act, sag, _experts(bf, d, f, nloc),
                         _rows(Float32, (nloc, d // BLOCK, f // BLOCK), 4), tiles, y, st, options=opts),
            cute.compile(Combine(d), y, row_of, _rows(Float32, (t, TOP_K), 4), _rows(bf, (t, d)), st, options=opts))
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
    decode(gemm2_weights.contiguous().view(torch.uint8).view(-1), w2.view(-1))
    gemm1(xg, sag, gemm1_weights.contiguous().view(torch.uint8).permute(1, 2, 0), gemm1_weights_scale.contiguous(),
          tiles, act)
    gemm2(act, sag, w2.permute(1, 2, 0), gemm2_weights_scale.contiguous(), tiles, y)
    combine(y, row_of, w, out)
    return out
