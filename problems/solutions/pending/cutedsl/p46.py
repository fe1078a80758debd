"""p46 Qwen3-Coder router backward (routing weights, dispatch mask, logits -> dx, dW) in CuTe DSL.

Kernel 1 (prep): a CTA owns 64 tokens. It first sums the dispatch-mask gradient over the 8 choices ([E, 8,
T], read along T in 16-byte loads of 8 tokens) into shared memory; then a warp per token (lane l holds
experts E/32 l ..) forms d_top = gw / S - (sum gw p_top) / S^2 (fp32, the reference's order), scatters it
onto its experts, adds the mask term (each batch of 4 tokens loaded before its arithmetic), and dlogits = p
(dp - sum dp p) + dL/dlogits; dl = bf16(dlogits) is written row-major [T, E] (for dx) and, through shared
memory, transposed [E, T] (for dW).
Kernel 2 (replacement of the shipped GEMM, speed): a persistent warp-specialised WGMMA GEMM over 128x128
tiles -- one producer thread issues the TMA loads of A (128 x 64, K-major) and B (64 K rows x 128 columns,
read N-major in place) into a 6-stage full/empty mbarrier ring and runs ahead across tiles; two consumer
warpgroups (setmaxnreg 40 / 232) own 64 rows each, four m64n128k16 per k-tile into the fp32 accumulator, and
store the tile as output pairs (bf16x2 / fp32x2 stores). dx = dl @ W (K = E = 128; 8192 tiles in groups of
16 row tiles), and dW = dl^T @ x split over K = T into 8 chunks (16 column tiles x 8 = 128 tiles, one per
SM) of fp32 partials; kernel 3 sums the partials in a fixed order and rounds to bf16 once. The prep's arithmetic
and the sum kernel are the shipped ones.
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

TOP_K = 8
TB = 64            # tokens per prep CTA
PAD = TB + 1       # shared row pitch (floats), against bank conflicts
SPLITS = 8         # K (token) chunks of the dW GEMM: 16 column tiles x 8 = 128 tiles, one per SM
TILE_M, TILE_N = 128, 128
STAGES = 6         # 6 x (16 KB of A + 16 KB of B)
GROUP = 16         # row tiles per raster group
THREADS_WS = 384   # producer warpgroup + two consumer warpgroups
CONSUMER_WARPS = 8
PRODUCER_REGS, CONSUMER_REGS = 40, 232
H200_SMS = 132     # multiprocessors of the target when compiling without a GPU


class GemmWS:
    """C[z] (M, N) = A(M, K_z) @ B(N, K_z)^T over the z-th chunk of K (kc k-tiles of 64), bf16 operands (A
    K-major, B K- or N-major), fp32 accumulation: persistent and warp-specialised over 128x128 tiles.

    Warp 0 issues the TMA loads of A (128 x 64) and B (128 x 64) into a STAGES-deep full/empty mbarrier ring
    and runs ahead across tiles; warpgroups 1 and 2 own 64 rows each (setmaxnreg 40 / 232): per k-tile four
    WGMMA m64n128k16 into the fp32 accumulator, wait, release the stage.  Epilogue: pairs of the output dtype
    stored straight from the fragment.  Tiles: z outermost, then GROUP row tiles walking the column tiles.
    """

    def __init__(self, kt_per_split: int, sms: int):
        self.kc = kt_per_split
        self.sms = sms

    @cute.jit
    def __call__(self, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, stream):
        bf = mA.element_type
        a_l, b_l = utils.LayoutEnum.from_tensor(mA), utils.LayoutEnum.from_tensor(mB)
        tiled_mma = sm90_utils.make_trivial_tiled_mma(
            bf, bf, a_l.sm90_mma_major_mode(), b_l.sm90_mma_major_mode(), Float32, (2, 1, 1),
            tiler_mn=(64, TILE_N))                                   # two warpgroups stacked along M
        bk = cute.size(tiled_mma.shape_mnk, mode=[2]) * 4
        tile = (TILE_M, TILE_N, bk)
        sA_l = sm90_utils.make_smem_layout_a(a_l, tile, bf, STAGES)
        sB_l = sm90_utils.make_smem_layout_b(b_l, tile, bf, STAGES)
        tma_a, gA_tma = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mA,
                                                    cute.slice_(sA_l, (None, None, 0)), (TILE_M, bk))
        tma_b, gB_tma = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mB,
                                                    cute.slice_(sB_l, (None, None, 0)), (TILE_N, bk))

        @cute.struct
        class Smem:
            mbar: cute.struct.MemRange[cutlass.Int64, STAGES * 2]
            sA: cute.struct.Align[cute.struct.MemRange[bf, cute.cosize(sA_l)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[bf, cute.cosize(sB_l)], 1024]
        self.smem_t = Smem
        self.ab_dtype = bf
        self.bk = bk
        tiles = mC.shape[0] * cute.ceil_div(mC.shape[1], TILE_M) * cute.ceil_div(mC.shape[2], TILE_N)
        self.kernel(tma_a, gA_tma, tma_b, gB_tma, mC, tiled_mma, sA_l, sB_l).launch(
            grid=[cutlass.min(tiles, self.sms), 1, 1], block=[THREADS_WS, 1, 1], min_blocks_per_mp=1,
            stream=stream)

    @cute.kernel
    def kernel(self, tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom, mB: cute.Tensor,
               mC: cute.Tensor, tiled_mma: cute.TiledMma, sA_l: cute.ComposedLayout, sB_l: cute.ComposedLayout):
        tidx, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        nctas, _, _ = cute.arch.grid_dim()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp == 0:
            cpasync.prefetch_descriptor(tma_a)
            cpasync.prefetch_descriptor(tma_b)
        storage = cutlass.utils.SmemAllocator().allocate(self.smem_t)
        tx_bytes = cute.size_in_bytes(self.ab_dtype, cute.slice_(sA_l, (None, None, 0))) + \
            cute.size_in_bytes(self.ab_dtype, cute.slice_(sB_l, (None, None, 0)))
        pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar.data_ptr(), num_stages=STAGES,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, CONSUMER_WARPS),
            tx_count=tx_bytes, cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)))
        sA = storage.sA.get_tensor(sA_l.outer, swizzle=sA_l.inner)
        sB = storage.sB.get_tensor(sB_l.outer, swizzle=sB_l.inner)
        gA = cute.local_tile(mA, (TILE_M, self.bk), (None, None))        # (128, 64, m tiles, k tiles)
        gB = cute.local_tile(mB, (TILE_N, self.bk), (None, None))        # (128, 64, n tiles, k tiles)
        m_tiles = cute.ceil_div(mC.shape[1], TILE_M)
        n_tiles = cute.ceil_div(mC.shape[2], TILE_N)
        per_z = m_tiles * n_tiles
        tiles = mC.shape[0] * per_z
        k_all = cute.size(gA, mode=[3])
        if warp < 4:                                                     # producer warpgroup
            cute.arch.setmaxregister_decrease(PRODUCER_REGS)
            if warp == 0:
                tAsA, tAgA = cpasync.tma_partition(tma_a, 0, cute.make_layout(1),
                                                   cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2))
                tBsB, tBgB = cpasync.tma_partition(tma_b, 0, cute.make_layout(1),
                                                   cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2))
                prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, STAGES)
                t = cutlass.Int32(bid)
                while t < tiles:
                    z = t // per_z
                    mt, nt = _tile_coords(t - z * per_z, m_tiles, n_tiles)
                    kt0 = z * self.kc
                    for kt in cutlass.range(cutlass.min(k_all - kt0, self.kc), unroll=1):
                        pipe.producer_acquire(prod)
                        bar = pipe.producer_get_barrier(prod)
                        cute.copy(tma_a, tAgA[(None, mt, kt0 + kt)], tAsA[(None, prod.index)], tma_bar_ptr=bar)
                        cute.copy(tma_b, tBgB[(None, nt, kt0 + kt)], tBsB[(None, prod.index)], tma_bar_ptr=bar)
                        pipe.producer_commit(prod)
                        prod.advance()
                    t = t + nctas
                pipe.producer_tail(prod)
        else:                                                            # two consumer warpgroups
            cute.arch.setmaxregister_increase(CONSUMER_REGS)
            thr_mma = tiled_mma.get_slice(tidx - 128)
            tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
            tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
            cT = thr_mma.partition_C(cute.make_identity_tensor((TILE_M, TILE_N)))
            _check_fragment(cT)
            acc = cute.make_rmem_tensor(cT.shape, Float32)
            r0 = cT[0][0]
            c0 = cT[0][1]
            rows = mC.shape[1]
            cols = mC.shape[2]
            cons = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, STAGES)
            tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
            t = cutlass.Int32(bid)
            while t < tiles:
                z = t // per_z
                mt, nt = _tile_coords(t - z * per_z, m_tiles, n_tiles)
                kt0 = z * self.kc
                acc.fill(0.0)
                for kt in cutlass.range(cutlass.min(k_all - kt0, self.kc), unroll=1):
                    pipe.consumer_wait(cons)
                    warpgroup.fence()
                    for kb in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
                        cute.gemm(tiled_mma, acc, tCrA[None, None, kb, cons.index],
                                  tCrB[None, None, kb, cons.index], acc)
                    warpgroup.commit_group()
                    warpgroup.wait_group(0)
                    pipe.consumer_release(cons)
                    cons.advance()
                for h in cutlass.range_constexpr(2):                      # epilogue: output pairs
                    row = mt * TILE_M + r0 + 8 * h
                    if row < rows:
                        crow = cute.zipped_divide(mC[z, row, None], (2,))
                        for c in cutlass.range_constexpr(cute.size(acc) // 4):
                            col = nt * TILE_N + c0 + 8 * c
                            if col < cols:
                                ro = cute.make_rmem_tensor((2,), mC.element_type)
                                for j in cutlass.range_constexpr(2):
                                    ro[j] = acc[4 * c + 2 * h + j].to(mC.element_type)
                                cute.autovec_copy(ro, crow[None, col // 2])
                t = t + nctas


def _check_fragment(cT):
    """The epilogue indexes the accumulator by position: element i = j + 2h + 4c of a thread's m64n128 fragment
    sits at tile row r0 + 8h, column c0 + 8c + j (checked while tracing)."""
    if str(cT.layout) != "((2,2,16),1,1):((1@1,8@0,8@1),0,0)":
        raise ValueError(f"unexpected WGMMA accumulator layout {cT.layout}")


def _tile_coords(t, m_tiles, n_tiles):
    """Tile t's (m tile, n tile) in grouped order: GROUP m tiles walk the n tiles together, so the CTAs resident
    at once share GROUP row bands of A and a few column bands of B in L2."""
    per = GROUP * n_tiles
    g = t // per
    first = g * GROUP
    gm = cutlass.min(m_tiles - first, GROUP)
    r = t - g * per
    return first + r % gm, r // gm


class Prep:
    """dl = bf16(dlogits) as [T, E] and [E, T]; a CTA of 8 warps per 64 tokens, lane l holds experts
    EPL*l .. EPL*l + EPL - 1 (EPL = E / 32; 1 for E < 32, lanes past E idle)."""

    def __init__(self, experts: int):
        assert experts % 32 == 0 or experts < 32
        self.E = experts
        self.epl = max(1, experts // 32)

    @cute.jit
    def __call__(self, probs, ids, top_sum, gw, gmask, glog, dl, dlt, stream):
        t = probs.shape[0]
        self.kernel(probs, ids, top_sum, gw, gmask, glog, dl, dlt).launch(
            grid=[(t + TB - 1) // TB, 1, 1], block=[256, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, probs: cute.Tensor, ids: cute.Tensor, top_sum: cute.Tensor, gw: cute.Tensor,
               gmask: cute.Tensor, glog: cute.Tensor, dl: cute.Tensor, dlt: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        ntok = probs.shape[0]
        t0 = bidx * TB
        # one [E, TB] buffer: the mask sums, then (each entry rewritten by the thread that read it) dl
        sbuf = cutlass.utils.SmemAllocator().allocate_tensor(Float32, cute.make_layout(self.E * PAD))
        ng = TB // 8                                                   # mask term: sum over the 8 choices,
        for j in cutlass.range((self.E * ng + 255) // 256, unroll=1):  # 8 tokens per 16-byte load
            idx = tidx + 256 * j
            if idx < self.E * ng:
                e = idx // ng
                g = idx % ng
                tg = cutlass.min(t0 + 8 * g, ntok - 8)     # T % 8 == 0: a group is wholly in or out (then unused)
                s8 = cute.make_rmem_tensor((8,), Float32)
                for u in cutlass.range_constexpr(8):
                    s8[u] = Float32(0.0)
                for k in cutlass.range_constexpr(TOP_K):
                    rv = cute.make_rmem_tensor((8,), gmask.element_type)
                    cute.autovec_copy(cute.zipped_divide(gmask[e, k, None], (8,))[None, tg // 8], rv)
                    for u in cutlass.range_constexpr(8):
                        s8[u] = s8[u] + rv[u].to(Float32)
                for u in cutlass.range_constexpr(8):
                    sbuf[e * PAD + 8 * g + u] = s8[u]
        cute.arch.sync_threads()
        lane = tidx % 32
        warp = tidx // 32
        nr = TB // 16                                                  # tokens of this warp: warp + 8 (nr hh + r)
        for hh in cutlass.range_constexpr(2):                         # two halves: fewer registers, more CTAs
            r_s = cute.make_rmem_tensor((nr,), Float32)
            r_id = cute.make_rmem_tensor((nr,), Int32)
            r_gw = cute.make_rmem_tensor((nr,), Float32)
            r_pj = cute.make_rmem_tensor((nr,), Float32)
            r_p = cute.make_rmem_tensor((self.epl, nr), Float32)
            r_gl = cute.make_rmem_tensor((self.epl, nr), Float32)
            for r in cutlass.range_constexpr(nr):     # every independent load of these 4 tokens first
                t = cutlass.min(t0 + warp + 8 * (nr * hh + r), ntok - 1)
                r_s[r] = top_sum[t, 0]
                r_id[r] = Int32(-1)
                r_gw[r] = Float32(0.0)
                if lane < TOP_K:
                    r_id[r] = Int32(ids[t, lane])
                    r_gw[r] = gw[t, lane].to(Float32)
                for c in cutlass.range_constexpr(self.epl):
                    r_p[c, r] = Float32(0.0)
                    r_gl[c, r] = Float32(0.0)
                    e = lane * self.epl + c
                    if e < self.E:
                        r_p[c, r] = probs[t, e]
                        r_gl[c, r] = glog[t, e].to(Float32)
            for r in cutlass.range_constexpr(nr):     # then their gathers of p[ids] together
                t = cutlass.min(t0 + warp + 8 * (nr * hh + r), ntok - 1)
                r_pj[r] = Float32(0.0)
                if lane < TOP_K:
                    r_pj[r] = probs[t, r_id[r]]
            for r in cutlass.range_constexpr(nr):     # the shipped arithmetic, token by token, from registers
                tl = warp + 8 * (nr * hh + r)
                t = cutlass.min(t0 + tl, ntok - 1)
                S = r_s[r]
                my_id = r_id[r]
                gwj = r_gw[r]
                a = gwj * r_pj[r]
                for sh in cutlass.range_constexpr(3):                      # lanes 0..7 hold the 8 choices
                    a = a + cute.arch.shuffle_sync_bfly(a, offset=1 << sh)
                dtop = gwj / S - a / (S * S)
                dp = cute.make_rmem_tensor((self.epl,), Float32)
                for c in cutlass.range_constexpr(self.epl):
                    dp[c] = Float32(0.0)
                for j in cutlass.range_constexpr(TOP_K):
                    idj = cute.arch.shuffle_sync(my_id, offset=j)
                    dj = cute.arch.shuffle_sync(dtop, offset=j)
                    for c in cutlass.range_constexpr(self.epl):
                        if idj == lane * self.epl + c:
                            dp[c] = dj
                part = Float32(0.0)
                for c in cutlass.range_constexpr(self.epl):
                    e = lane * self.epl + c
                    if e < self.E:
                        dp[c] = dp[c] + sbuf[e * PAD + tl]
                        part = part + dp[c] * r_p[c, r]
                tot = cute.arch.warp_reduction_sum(part)
                for c in cutlass.range_constexpr(self.epl):
                    e = lane * self.epl + c
                    if e < self.E:
                        v = (r_p[c, r] * (dp[c] - tot) + r_gl[c, r]).to(dl.element_type)
                        sbuf[e * PAD + tl] = v.to(Float32)
                        if t0 + tl < ntok:
                            dl[t, e] = v
        cute.arch.sync_threads()
        for j in cutlass.range_constexpr((self.E * TB + 255) // 256):   # transposed copy, coalesced along T
            idx = tidx + 256 * j
            if idx < self.E * TB:
                e = idx // TB
                tl = idx % TB
                if t0 + tl < ntok:
                    dlt[e, t0 + tl] = sbuf[e * PAD + tl].to(dlt.element_type)


class SumSplits:
    """out (M, N) bf16 = sum over z of part[z] (fp32), in z order."""

    @cute.jit
    def __call__(self, part: cute.Tensor, out: cute.Tensor, stream):
        n = out.shape[0] * out.shape[1]
        self.kernel(part, out).launch(grid=[(n + 255) // 256, 1, 1], block=[256, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, part: cute.Tensor, out: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        i = bidx * 256 + tidx
        cols = out.shape[1]
        if i < out.shape[0] * cols:
            r = i // cols
            c = i % cols
            s = Float32(0.0)
            for z in cutlass.range(part.shape[0], unroll=1):
                s = s + part[z, r, c]
            out[r, c] = s.to(out.element_type)


_COMPILED = {}


def _kt_per_split(tokens: int) -> int:
    """k-tiles (of 64 tokens) per dW chunk: SPLITS chunks."""
    return max(1, -(-tokens // (64 * SPLITS)))


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _prepare(x, w_router, probs, ids, top_sum, grad_w, grad_mask, grad_logits, arch=None):
    d, e = x.shape[1], w_router.shape[0]
    key = (d, e, _kt_per_split(x.shape[0]))
    if key not in _COMPILED:
        opts = f"--gpu-arch {arch or _arch()} --enable-tvm-ffi"
        stream = make_fake_stream(use_tvm_ffi_env_stream=True)
        t, z = cute.sym_int(divisibility=8), cute.sym_int()        # T % 8 == 0: the prep's 16-byte mask loads
        bf, f32 = cutlass.BFloat16, Float32

        def rows(dtype, shape):
            return make_fake_compact_tensor(dtype, shape, stride_order=tuple(range(len(shape) - 1, -1, -1)),
                                            assumed_align=16)

        def cols(dtype, shape):  # a transposed view of a row-major matrix
            return make_fake_compact_tensor(dtype, shape, stride_order=(0, 1), assumed_align=16)

        prep = cute.compile(Prep(e), rows(f32, (t, e)), rows(cutlass.Int64, (t, TOP_K)), rows(f32, (t, 1)),
                            rows(bf, (t, TOP_K)), rows(bf, (e, TOP_K, t)), rows(bf, (t, e)), rows(bf, (t, e)),
                            rows(bf, (e, t)), stream, options=opts)
        sms = H200_SMS if arch else torch.cuda.get_device_properties(0).multi_processor_count
        gemm_dx = cute.compile(GemmWS(1 << 20, sms), rows(bf, (t, e)), cols(bf, (d, e)), rows(bf, (1, t, d)),
                               stream, options=opts)
        gemm_dw = cute.compile(GemmWS(_kt_per_split(x.shape[0]), sms), rows(bf, (e, t)), cols(bf, (d, t)),
                               rows(f32, (z, e, d)), stream, options=opts)
        reduce = cute.compile(SumSplits(), rows(f32, (z, e, d)), rows(bf, (e, d)), stream, options=opts)
        _COMPILED[key] = (prep, gemm_dx, gemm_dw, reduce)
    return list(_COMPILED[key])


def solve(x, w_router, probs, ids, top_sum, grad_w, grad_mask, grad_logits):
    prep, gemm_dx, gemm_dw, reduce = _prepare(x, w_router, probs, ids, top_sum, grad_w, grad_mask, grad_logits)
    t, d = x.shape
    e = w_router.shape[0]
    dev = x.device
    dl = torch.empty(t, e, dtype=torch.bfloat16, device=dev)
    dlt = torch.empty(e, t, dtype=torch.bfloat16, device=dev)
    prep(probs.contiguous(), ids.contiguous(), top_sum.contiguous(), grad_w.contiguous(), grad_mask.contiguous(),
         grad_logits.contiguous(), dl, dlt)
    dx = torch.empty(1, t, d, dtype=torch.bfloat16, device=dev)
    gemm_dx(dl, w_router.contiguous().t(), dx)
    splits = -(-t // (64 * _kt_per_split(t)))
    part = torch.empty(splits, e, d, dtype=torch.float32, device=dev)
    gemm_dw(dlt, x.contiguous().t(), part)
    dw = torch.empty(e, d, dtype=torch.bfloat16, device=dev)
    reduce(part, dw)
    return dx[0], dw
