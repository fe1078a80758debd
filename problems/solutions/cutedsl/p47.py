"""p47 ERNIE-4.5 MoE block (fp32 router, softmax top-8 by prob + correction bias, SwiGLU experts, shared expert) in CuTe DSL.

1. Router GEMM in fp32 on CUDA cores (the router weight is fp32, not bf16 values, so a bf16 WGMMA would
   round it): logits = x @ W_r^T with smem tiles, a 4 x 4 register tile per thread, and short fp32
   chains: each k-tile's 32 products in a fresh register, 16 tile sums in a second one, then the
   group sums (a CPU emulation of this order at full scale: max error 0.45x the tolerance's floor
   3 eps max|logit|; one chain per k-tile with the tile sums added directly: 1.7x that floor).
2. Routing, a warp per token: softmax, 8 rounds of a warp arg-max of p + bias (then lower id), weights
   p / max(sum of the 8 p, norm_min) in fp32.
3. Dispatch, a CTA per expert (no atomics, deterministic): count its assignments, then its row offset
   in a gathered buffer whose expert segments are padded to the 128-row GEMM tile, and the rows of its
   assignments in token order; the tile -> expert map; then a gather of the token rows.
4. Grouped GEMMs (TMA + 4-stage mbarrier pipeline + WGMMA, fp32 accumulate): act = silu(x W_g^T) *
   (x W_u^T) (gate and up tiles share the A tile; SwiGLU in the epilogue, one bf16 rounding), then
   y = act W_d^T (bf16); a tile reads its expert's weights through a 3-D [N, K, E] TMA view.
   The shared expert runs through the same kernels as one dense group.
5. Combine, a CTA per token: out = sum_j w_j y_j + shared, in fp32, rounded once (the reference rounds
   each expert's weighted output and each bf16 index_add; one rounding is closer to the fp64 anchor).
"""
import torch

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass.tensor_utils import LayoutEnum
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

TOP_K = 8
BM = 128            # GEMM m-tile = padding of each expert's row segment
VEC = 8
NEG = -3.0e38
RT = 128            # router GEMM: threads, 32 tokens x 64 experts per CTA, k-tiles of 32
RBM, RBN, RBK = 32, 64, 32
GROUP = 16          # k-tiles per partial sum of the router GEMM


class Gemm:
    """C (R, N) = A (R, K) @ B[e] (N, K)^T, e = tiles[row block] (or 0 when dense); with swiglu,
    C = silu(A B[e]^T) * (A B2[e]^T).  B, B2 are [N, K, E] views of the expert weights."""

    def __init__(self, swiglu: bool, grouped: bool, stages=4):
        self.swiglu, self.grouped, self.stages = swiglu, grouped, stages
        self.bn = 64 if swiglu else 128

    @cute.jit
    def __call__(self, mA: cute.Tensor, mB: cute.Tensor, mB2: cute.Tensor, mTiles: cute.Tensor, mC: cute.Tensor,
                 stream):
        a_l, b_l = LayoutEnum.from_tensor(mA), LayoutEnum.from_tensor(mB)
        tiled_mma = sm90_utils.make_trivial_tiled_mma(
            mA.element_type, mB.element_type, a_l.sm90_mma_major_mode(), b_l.sm90_mma_major_mode(),
            Float32, (1, 1, 1), tiler_mn=(64, self.bn))
        bk = cute.size(tiled_mma.shape_mnk, mode=[2]) * 4
        tile = (BM, self.bn, bk)
        sA_l = sm90_utils.make_smem_layout_a(a_l, tile, mA.element_type, self.stages)
        sB_l = sm90_utils.make_smem_layout_b(b_l, tile, mB.element_type, self.stages)
        op = cpasync.CopyBulkTensorTileG2SOp()
        tma_a, gA = cpasync.make_tiled_tma_atom(op, mA, cute.slice_(sA_l, (None, None, 0)), (BM, bk))
        tma_b, gB = cpasync.make_tiled_tma_atom(op, mB, cute.slice_(sB_l, (None, None, 0)), (self.bn, bk))
        tma_b2, gB2 = cpasync.make_tiled_tma_atom(op, mB2, cute.slice_(sB_l, (None, None, 0)), (self.bn, bk))
        nb = 2 if self.swiglu else 1

        @cute.struct
        class Smem:
            mbar: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            sA: cute.struct.Align[cute.struct.MemRange[mA.element_type, cute.cosize(sA_l)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[mB.element_type, cute.cosize(sB_l) * nb], 1024]
        self.smem_t = Smem
        self.ab_dtype = mA.element_type
        self.tile = tile
        grid = (cute.ceil_div(mC.shape[0], BM), cute.ceil_div(mC.shape[1], self.bn), 1)
        self.kernel(tma_a, gA, tma_b, gB, tma_b2, gB2, mTiles, mC, tiled_mma, sA_l, sB_l).launch(
            grid=grid, block=[128, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom, mB: cute.Tensor,
               tma_b2: cute.CopyAtom, mB2: cute.Tensor, mTiles: cute.Tensor, mC: cute.Tensor,
               tiled_mma: cute.TiledMma, sA_l: cute.ComposedLayout, sB_l: cute.ComposedLayout):
        tidx, _, _ = cute.arch.thread_idx()
        bm, bn, _ = cute.arch.block_idx()
        e = Int32(0)
        if cutlass.const_expr(self.grouped):
            e = mTiles[bm]
        if e >= 0:
            warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
            storage = cutlass.memory.SmemAllocator().allocate(self.smem_t)
            b_bytes = cute.size_in_bytes(self.ab_dtype, cute.slice_(sB_l, (None, None, 0)))
            tx_bytes = cute.size_in_bytes(self.ab_dtype, cute.slice_(sA_l, (None, None, 0))) + b_bytes * (
                2 if self.swiglu else 1)
            pipe = pipeline.PipelineTmaAsync.create(
                barrier_storage=storage.mbar.data_ptr(), num_stages=self.stages,
                producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
                consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 4),
                tx_count=tx_bytes, cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)))
            sA = storage.sA.get_tensor(sA_l.outer, swizzle=sA_l.inner)
            sB = storage.sB.get_tensor(sB_l.outer, swizzle=sB_l.inner)
            sB2 = cute.make_tensor(sB.iterator + cute.cosize(sB_l.outer), sB.layout)
            gA = cute.local_tile(mA, self.tile, (bm, bn, None), proj=(1, None, 1))
            gB = cute.local_tile(mB[None, None, e], self.tile, (bm, bn, None), proj=(None, 1, 1))
            gB2 = cute.local_tile(mB2[None, None, e], self.tile, (bm, bn, None), proj=(None, 1, 1))
            gC = cute.local_tile(mC, self.tile, (bm, bn, None), proj=(1, 1, None))
            tAsA, tAgA = cpasync.tma_partition(tma_a, 0, cute.make_layout(1),
                                               cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2))
            tBsB, tBgB = cpasync.tma_partition(tma_b, 0, cute.make_layout(1),
                                               cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2))
            tBsB2, tBgB2 = cpasync.tma_partition(tma_b2, 0, cute.make_layout(1),
                                                 cute.group_modes(sB2, 0, 2), cute.group_modes(gB2, 0, 2))
            thr_mma = tiled_mma.get_slice(tidx)
            tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
            tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
            tCrB2 = tiled_mma.make_fragment_B(thr_mma.partition_B(sB2))
            tCgC = thr_mma.partition_C(gC)
            acc = cute.make_rmem_tensor(tCgC.shape, Float32)
            acc2 = cute.make_rmem_tensor(tCgC.shape, Float32)
            acc.fill(0.0)
            acc2.fill(0.0)
            k_tiles = cute.size(gA, mode=[2])
            prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
            cons = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
            if warp == 0:
                for _ in cutlass.range(cutlass.min(self.stages, k_tiles), unroll=1):
                    self.load(pipe, prod, tma_a, tAgA, tAsA, tma_b, tBgB, tBsB, tma_b2, tBgB2, tBsB2)
                    prod.advance()
            tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
            for kt in cutlass.range(k_tiles, unroll=1):
                pipe.consumer_wait(cons)
                warpgroup.fence()
                for kb in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
                    a_kb = tCrA[None, None, kb, cons.index]
                    cute.gemm(tiled_mma, acc, a_kb, tCrB[None, None, kb, cons.index], acc)
                    if cutlass.const_expr(self.swiglu):
                        cute.gemm(tiled_mma, acc2, a_kb, tCrB2[None, None, kb, cons.index], acc2)
                warpgroup.commit_group()
                warpgroup.wait_group(0)
                pipe.consumer_release(cons)
                cons.advance()
                if warp == 0 and prod.count < k_tiles:
                    self.load(pipe, prod, tma_a, tAgA, tAsA, tma_b, tBgB, tBsB, tma_b2, tBgB2, tBsB2)
                    prod.advance()
            cC = thr_mma.partition_C(cute.local_tile(cute.make_identity_tensor(mC.shape), self.tile,
                                                     (bm, bn, None), proj=(1, 1, None)))
            for i in cutlass.range_constexpr(cute.size(acc)):
                if cute.elem_less(cC[i], mC.shape):
                    v = acc[i]
                    if cutlass.const_expr(self.swiglu):
                        v = v / (1.0 + cute.math.exp(-v)) * acc2[i]
                    tCgC[i] = v.to(mC.element_type)

    @cute.jit
    def load(self, pipe, prod, tma_a, tAgA, tAsA, tma_b, tBgB, tBsB, tma_b2, tBgB2, tBsB2):
        pipe.producer_acquire(prod)
        bar = pipe.producer_get_barrier(prod)
        cute.copy(tma_a, tAgA[(None, prod.count)], tAsA[(None, prod.index)], tma_bar_ptr=bar)
        cute.copy(tma_b, tBgB[(None, prod.count)], tBsB[(None, prod.index)], tma_bar_ptr=bar)
        if cutlass.const_expr(self.swiglu):
            cute.copy(tma_b2, tBgB2[(None, prod.count)], tBsB2[(None, prod.index)], tma_bar_ptr=bar)
        pipe.producer_commit(prod)


class RouterGemm:
    """logits (T, E) = x (T, K) bf16 -> fp32 @ W (E, K) fp32, on CUDA cores; thread (tr, tc) owns rows
    4 tr .. and columns 4 tc ..; three-level fp32 sums: a fresh 32-term FMA chain per k-tile, the tile
    sums of GROUP k-tiles, then the group sums."""

    def __init__(self, experts: int, hidden: int):
        assert hidden % RBK == 0
        self.N, self.K = experts, hidden

    @cute.jit
    def __call__(self, x: cute.Tensor, w: cute.Tensor, out: cute.Tensor, stream):
        grid = [(x.shape[0] + RBM - 1) // RBM, (self.N + RBN - 1) // RBN, 1]
        self.kernel(x, w, out).launch(grid=grid, block=[RT, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, x: cute.Tensor, w: cute.Tensor, out: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bm, bn, _ = cute.arch.block_idx()
        m = x.shape[0]
        alloc = cutlass.memory.SmemAllocator()
        a_s = alloc.allocate_tensor(Float32, cute.make_layout((RBK, RBM + 4), stride=(RBM + 4, 1)), byte_alignment=16)
        b_s = alloc.allocate_tensor(Float32, cute.make_layout((RBK, RBN + 4), stride=(RBN + 4, 1)), byte_alignment=16)
        row0 = bm * RBM
        col0 = bn * RBN
        tr = tidx // (RBN // 4)
        tc = tidx % (RBN // 4)
        acc = cute.make_rmem_tensor((16,), Float32)
        acc.fill(0.0)
        mid = cute.make_rmem_tensor((16,), Float32)
        tile = cute.make_rmem_tensor((16,), Float32)
        ra = cute.make_rmem_tensor((4,), Float32)
        rb = cute.make_rmem_tensor((4,), Float32)
        vx = cute.make_rmem_tensor((VEC,), x.element_type)
        vw = cute.make_rmem_tensor((4,), Float32)
        ar = tidx // (RBK // VEC)                  # A tile: 32 rows x 32 k = one 8-wide bf16 vector a thread
        ka = (tidx % (RBK // VEC)) * VEC
        ga = cutlass.min(row0 + ar, m - 1)
        kt_n = self.K // RBK
        for ko in cutlass.range((kt_n + GROUP - 1) // GROUP, unroll=1):
            mid.fill(0.0)
            for ki in cutlass.range(cutlass.min(GROUP, kt_n - ko * GROUP), unroll=1):
                k0 = (ko * GROUP + ki) * RBK
                cute.autovec_copy(cute.zipped_divide(x[ga, None], (VEC,))[None, (k0 + ka) // VEC], vx)
                for e in cutlass.range_constexpr(VEC):
                    a_s[ka + e, ar] = vx[e].to(Float32)
                for i in cutlass.range_constexpr(RBN * RBK // 4 // RT):
                    cb = i * RT + tidx
                    nb = cb // (RBK // 4)
                    kb = (cb % (RBK // 4)) * 4
                    gb = cutlass.min(col0 + nb, self.N - 1)
                    cute.autovec_copy(cute.zipped_divide(w[gb, None], (4,))[None, (k0 + kb) // 4], vw)
                    for e in cutlass.range_constexpr(4):
                        b_s[kb + e, nb] = vw[e]
                cute.arch.sync_threads()
                tile.fill(0.0)                      # a fresh chain per k-tile
                for kk in cutlass.range_constexpr(RBK):
                    cute.autovec_copy(cute.zipped_divide(a_s[kk, None], (4,))[None, tr], ra)
                    cute.autovec_copy(cute.zipped_divide(b_s[kk, None], (4,))[None, tc], rb)
                    for i in cutlass.range_constexpr(4):
                        for j in cutlass.range_constexpr(4):
                            tile[i * 4 + j] = tile[i * 4 + j] + ra[i] * rb[j]
                for i in cutlass.range_constexpr(16):
                    mid[i] = mid[i] + tile[i]
                cute.arch.sync_threads()
            for i in cutlass.range_constexpr(16):   # every GROUP k-tiles the group's sum joins the total
                acc[i] = acc[i] + mid[i]
        for i in cutlass.range_constexpr(4):
            er = row0 + tr * 4 + i
            if er < m:
                for j in cutlass.range_constexpr(4):
                    en = col0 + tc * 4 + j
                    if en < self.N:
                        out[er, en] = acc[i * 4 + j]


class Router:
    """A warp per token (lane l: experts EPL l ..): softmax, top-8 of p + bias (value, then lower id),
    weights p / max(sum of the 8 p in selection order, norm_min)."""

    def __init__(self, experts: int, norm_min: float):
        self.E, self.epl, self.norm_min = experts, max(1, experts // 32), norm_min
        assert experts % 32 == 0 or experts < 32

    @cute.jit
    def __call__(self, logits, bias, ids, w, stream):
        self.kernel(logits, bias, ids, w).launch(grid=[(logits.shape[0] + 3) // 4, 1, 1], block=[128, 1, 1],
                                                 stream=stream)

    @cute.kernel
    def kernel(self, logits: cute.Tensor, bias: cute.Tensor, ids: cute.Tensor, w: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        lane = tidx % 32
        t = bidx * 4 + tidx // 32
        if t < logits.shape[0]:
            p = cute.make_rmem_tensor((self.epl,), Float32)
            sc = cute.make_rmem_tensor((self.epl,), Float32)
            m = Float32(NEG)
            for c in cutlass.range_constexpr(self.epl):
                ec = cutlass.min(lane * self.epl + c, self.E - 1)
                p[c] = logits[t, ec]
                if lane * self.epl + c < self.E:
                    m = cutlass.max(m, p[c])
            m = cute.arch.warp_reduction_max(m)
            s = Float32(0.0)
            for c in cutlass.range_constexpr(self.epl):
                p[c] = cute.math.exp(p[c] - m)
                if lane * self.epl + c >= self.E:
                    p[c] = Float32(0.0)
                s = s + p[c]
            s = cute.arch.warp_reduction_sum(s)
            for c in cutlass.range_constexpr(self.epl):
                p[c] = p[c] / s
                sc[c] = Float32(NEG)
                if lane * self.epl + c < self.E:
                    sc[c] = p[c] + bias[0, lane * self.epl + c]
            tsum = Float32(0.0)
            my_i = Int32(0)
            my_p = Float32(0.0)
            for k in cutlass.range_constexpr(TOP_K):
                bv = Float32(NEG)
                bp = Float32(0.0)
                bi = Int32(1 << 30)
                for c in cutlass.range_constexpr(self.epl):
                    if sc[c] > bv:
                        bv = sc[c]
                        bp = p[c]
                        bi = lane * self.epl + c
                for sh in cutlass.range_constexpr(5):
                    ov = cute.arch.shuffle_sync_bfly(bv, offset=1 << sh)
                    op = cute.arch.shuffle_sync_bfly(bp, offset=1 << sh)
                    oi = cute.arch.shuffle_sync_bfly(bi, offset=1 << sh)
                    if ov > bv or (ov == bv and oi < bi):
                        bv = ov
                        bp = op
                        bi = oi
                for c in cutlass.range_constexpr(self.epl):
                    if bi == lane * self.epl + c:
                        sc[c] = Float32(NEG)
                tsum = tsum + bp
                if lane == k:
                    my_i = bi
                    my_p = bp
            if lane < TOP_K:
                ids[t, lane] = my_i
                w[t, lane] = my_p / cutlass.max(tsum, Float32(self.norm_min))


class Dispatch:
    """A CTA per expert.  count: its number of assignments.  scatter: its row offset (segments padded to
    BM rows), the gathered row of each of its assignments in flat (token, choice) order, the token of
    each row (-1 on padding), and the expert of each row block (-1 past the last segment)."""

    def __init__(self, scatter: bool, top_k: int):
        self.scatter, self.k = scatter, top_k

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
        chunk = (n + 255) // 256                     # thread tidx scans flat assignments [lo, hi) in order
        lo = tidx * chunk
        hi = cutlass.min(lo + chunk, n)
        sm = cutlass.memory.SmemAllocator().allocate_tensor(Int32, cute.make_layout(258))
        c = Int32(0)
        for i in cutlass.range(lo, hi, unroll=1):
            if ids[i] == e:
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
                if ids[i] == e:
                    row_of[i] = row
                    tok_of[row] = i // self.k
                    row = row + 1
            end = off + (total + BM - 1) // BM * BM
            for r in cutlass.range(off + total + tidx, end, 256, unroll=1):
                tok_of[r] = Int32(-1)
            for b in cutlass.range(off // BM + tidx, end // BM, 256, unroll=1):
                tiles[b] = e
            if e == counts.shape[0] - 1:             # past the last segment: no rows, no tiles
                for r in cutlass.range(end + tidx, tok_of.shape[0], 256, unroll=1):
                    tok_of[r] = Int32(-1)
                for b in cutlass.range(end // BM + tidx, tiles.shape[0], 256, unroll=1):
                    tiles[b] = Int32(-1)


class Gather:
    """xg[row] = x[tok_of[row]] (rows with tok_of < 0 untouched), a CTA per row, 128-bit copies."""

    def __init__(self, hidden: int):
        self.nv = hidden // VEC

    @cute.jit
    def __call__(self, x, tok_of, xg, stream):
        self.kernel(x, tok_of, xg).launch(grid=[xg.shape[0], 1, 1], block=[128, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, x: cute.Tensor, tok_of: cute.Tensor, xg: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        tok = tok_of[row]
        if tok >= 0:
            r = cute.make_rmem_tensor((VEC,), x.element_type)
            for v in cutlass.range(tidx, self.nv, 128, unroll=1):
                cute.autovec_copy(cute.zipped_divide(x[tok, None], (VEC,))[None, v], r)
                cute.autovec_copy(r, cute.zipped_divide(xg[row, None], (VEC,))[None, v])


class Combine:
    """out[t] = sum_j w[t, j] y[row_of[t, j]] + ys[t], fp32, one bf16 rounding; a CTA per token."""

    def __init__(self, hidden: int, top_k: int):
        self.nv, self.k = hidden // VEC, top_k

    @cute.jit
    def __call__(self, y, row_of, w, ys, out, stream):
        self.kernel(y, row_of, w, ys, out).launch(grid=[out.shape[0], 1, 1], block=[128, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, y: cute.Tensor, row_of: cute.Tensor, w: cute.Tensor, ys: cute.Tensor, out: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        t, _, _ = cute.arch.block_idx()
        r = cute.make_rmem_tensor((VEC,), y.element_type)
        o = cute.make_rmem_tensor((VEC,), out.element_type)
        acc = cute.make_rmem_tensor((VEC,), Float32)
        for v in cutlass.range(tidx, self.nv, 128, unroll=1):
            for i in cutlass.range_constexpr(VEC):
                acc[i] = Float32(0.0)
            for j in cutlass.range_constexpr(self.k):
                row = row_of[t * self.k + j]
                wj = w[t, j]
                cute.autovec_copy(cute.zipped_divide(y[row, None], (VEC,))[None, v], r)
                for i in cutlass.range_constexpr(VEC):
                    acc[i] = acc[i] + wj * r[i].to(Float32)
            cute.autovec_copy(cute.zipped_divide(ys[t, None], (VEC,))[None, v], r)
            for i in cutlass.range_constexpr(VEC):
                o[i] = (acc[i] + r[i].to(Float32)).to(out.element_type)
            cute.autovec_copy(o, cute.zipped_divide(out[t, None], (VEC,))[None, v])


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _rows(dtype, shape):
    return make_fake_compact_tensor(dtype, shape, stride_order=tuple(range(len(shape) - 1, -1, -1)), assumed_align=16)


def _experts(dtype, n, k):  # [E, N, K] weights as an (N, K, E) view
    return make_fake_compact_tensor(dtype, (n, k, cute.sym_int()), stride_order=(1, 0, 2), assumed_align=16)


def _prepare(x, w_router, bias, w_gate, w_up, w_down, ws_gate, ws_up, ws_down, norm_min, arch=None):
    d, e, f, fs = x.shape[-1], w_router.shape[0], w_gate.shape[1], ws_gate.shape[0]
    key = (d, e, f, fs, float(norm_min))
    if key not in _COMPILED:
        assert d % RBK == 0 and f % VEC == 0 and fs % VEC == 0, (d, f, fs)
        opts = f"--gpu-arch {arch or _arch()} --enable-tvm-ffi"
        st = make_fake_stream(use_tvm_ffi_env_stream=True)
        t, r, nt, n = cute.sym_int(), cute.sym_int(), cute.sym_int(), cute.sym_int()
        bf, i32 = cutlass.BFloat16, Int32
        tiles = _rows(i32, (nt,))
        gate = _experts(bf, f, d)
        down = _experts(bf, d, f)
        sgate = _experts(bf, fs, d)
        sdown = _experts(bf, d, fs)
        _COMPILED[key] = (
            cute.compile(RouterGemm(e, d), _rows(bf, (t, d)), _rows(Float32, (e, d)), _rows(Float32, (t, e)), st,
                         options=opts),
            cute.compile(Router(e, float(norm_min)), _rows(Float32, (t, e)), _rows(Float32, (1, e)),
                         _rows(i32, (t, TOP_K)), _rows(Float32, (t, TOP_K)), st, options=opts),
            cute.compile(Dispatch(False, TOP_K), _rows(i32, (n,)), _rows(i32, (e,)), _rows(i32, (n,)),
                         _rows(i32, (r,)), tiles, st, options=opts),
            cute.compile(Dispatch(True, TOP_K), _rows(i32, (n,)), _rows(i32, (e,)), _rows(i32, (n,)),
                         _rows(i32, (r,)), tiles, st, options=opts),
            cute.compile(Gather(d), _rows(bf, (t, d)), _rows(i32, (r,)), _rows(bf, (r, d)), st, options=opts),
            cute.compile(Gemm(True, True), _rows(bf, (r, d)), gate, gate, tiles, _rows(bf, (r, f)), st, options=opts),
            cute.compile(Gemm(False, True), _rows(bf, (r, f)), down, down, tiles, _rows(bf, (r, d)), st, options=opts),
            cute.compile(Gemm(True, False), _rows(bf, (t, d)), sgate, sgate, tiles, _rows(bf, (t, fs)), st,
                         options=opts),
            cute.compile(Gemm(False, False), _rows(bf, (t, fs)), sdown, sdown, tiles, _rows(bf, (t, d)), st,
                         options=opts),
            cute.compile(Combine(d, TOP_K), _rows(bf, (r, d)), _rows(i32, (n,)), _rows(Float32, (t, TOP_K)),
                         _rows(bf, (t, d)), _rows(bf, (t, d)), st, options=opts))
    return list(_COMPILED[key])


def _nk(w):  # [E, N, K] -> (N, K, E) view; a dense [N, K] weight is one expert
    return (w if w.dim() == 3 else w[None]).permute(1, 2, 0)


def solve(x, w_router, bias, w_gate, w_up, w_down, ws_gate, ws_up, ws_down, norm_min):
    (router_gemm, router, count, scatter, gather, gemm_gu, gemm_d, shared_gu, shared_d,
     combine) = _prepare(x, w_router, bias, w_gate, w_up, w_down, ws_gate, ws_up, ws_down, norm_min)
    h = x.reshape(-1, x.shape[-1])
    t, d = h.shape
    e, f, fs = w_router.shape[0], w_gate.shape[1], ws_gate.shape[0]
    dev, bf = x.device, torch.bfloat16
    rows = -(-(t * TOP_K + e * (BM - 1)) // BM) * BM
    logits = torch.empty(t, e, dtype=torch.float32, device=dev)
    ids = torch.empty(t, TOP_K, dtype=torch.int32, device=dev)
    w = torch.empty(t, TOP_K, dtype=torch.float32, device=dev)
    counts = torch.empty(e, dtype=torch.int32, device=dev)
    row_of = torch.empty(t * TOP_K, dtype=torch.int32, device=dev)
    tok_of = torch.empty(rows, dtype=torch.int32, device=dev)
    tiles = torch.empty(rows // BM, dtype=torch.int32, device=dev)
    xg = torch.empty(rows, d, dtype=bf, device=dev)
    act = torch.empty(rows, f, dtype=bf, device=dev)
    y = torch.empty(rows, d, dtype=bf, device=dev)
    act_s = torch.empty(t, fs, dtype=bf, device=dev)
    ys = torch.empty(t, d, dtype=bf, device=dev)
    out = torch.empty(t, d, dtype=bf, device=dev)
    router_gemm(h, w_router.contiguous(), logits)
    router(logits, bias.contiguous(), ids, w)
    flat = ids.view(-1)
    count(flat, counts, row_of, tok_of, tiles)
    scatter(flat, counts, row_of, tok_of, tiles)
    gather(h, tok_of, xg)
    gemm_gu(xg, _nk(w_gate.contiguous()), _nk(w_up.contiguous()), tiles, act)
    gemm_d(act, _nk(w_down.contiguous()), _nk(w_down.contiguous()), tiles, y)
    shared_gu(h, _nk(ws_gate.contiguous()), _nk(ws_up.contiguous()), tiles, act_s)
    shared_d(act_s, _nk(ws_down.contiguous()), _nk(ws_down.contiguous()), tiles, ys)
    combine(y, row_of, w, ys, out)
    return out.view(x.shape), logits
