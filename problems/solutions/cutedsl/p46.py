"""p46 Qwen3-Coder router backward (routing weights, dispatch mask, logits -> dx, dW) in CuTe DSL.

Kernel 1 (prep): a CTA owns 64 tokens.  It first sums the dispatch-mask gradient over the 8 choices
([E, 8, T], read along T, coalesced) into shared memory; then a warp per token (lane l holds experts
E/32 l ..) forms d_top = gw / S - (sum gw p_top) / S^2 (fp32, the reference's order), scatters it onto
its experts, adds the mask term, and dlogits = p (dp - sum dp p) + dL/dlogits; dl = bf16(dlogits) is
written row-major [T, E] (for dx) and, through shared memory, transposed [E, T] (for dW).
Kernel 2 (WGMMA GEMM, TMA 4-stage pipeline, 128x128 tiles, bf16 in, fp32 accumulate): dx = dl @ W with W
read N-major in place (K = E = 128), and dW = dl^T @ x with x read N-major in place (K = T), split over
K into fp32 partials; kernel 3 sums the partials in a fixed order and rounds to bf16 once.
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
SPLIT_KT = 32      # k-tiles (of 64) per split of the dW GEMM


class Gemm:
    """C[z] (M,N) = A(M, K_z) @ B(N, K_z)^T over the z-th chunk of K; operands bf16, K- or MN-major."""

    def __init__(self, kt_per_split: int, tile_mn=(128, 128), stages=4):
        self.bm, self.bn = tile_mn
        self.stages = stages
        self.kc = kt_per_split

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
        grid = (cute.ceil_div(mC.shape[1], self.bm), cute.ceil_div(mC.shape[2], self.bn), mC.shape[0])
        self.kernel(tma_a, gA_tma, tma_b, gB_tma, mC, tiled_mma, sA_l, sB_l).launch(
            grid=grid, block=[128, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom, mB: cute.Tensor,
               mC: cute.Tensor, tiled_mma: cute.TiledMma, sA_l: cute.ComposedLayout, sB_l: cute.ComposedLayout):
        tidx, _, _ = cute.arch.thread_idx()
        bm, bn, bz = cute.arch.block_idx()
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
        mCz = mC[bz, None, None]
        gA = cute.local_tile(mA, self.tile, (bm, bn, None), proj=(1, None, 1))
        gB = cute.local_tile(mB, self.tile, (bm, bn, None), proj=(None, 1, 1))
        gC = cute.local_tile(mCz, self.tile, (bm, bn, None), proj=(1, 1, None))
        tAsA, tAgA = cpasync.tma_partition(tma_a, 0, cute.make_layout(1),
                                           cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2))
        tBsB, tBgB = cpasync.tma_partition(tma_b, 0, cute.make_layout(1),
                                           cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2))
        thr_mma = tiled_mma.get_slice(tidx)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
        tCgC = thr_mma.partition_C(gC)
        acc = cute.make_rmem_tensor(tCgC.shape, Float32)
        acc.fill(0.0)
        kt0 = bz * self.kc
        k_tiles = cutlass.min(cute.size(gA, mode=[2]) - kt0, self.kc)
        prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        cons = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        if warp == 0:
            for _ in cutlass.range(cutlass.min(self.stages, k_tiles), unroll=1):
                pipe.producer_acquire(prod)
                cute.copy(tma_a, tAgA[(None, kt0 + prod.count)], tAsA[(None, prod.index)],
                          tma_bar_ptr=pipe.producer_get_barrier(prod))
                cute.copy(tma_b, tBgB[(None, kt0 + prod.count)], tBsB[(None, prod.index)],
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
                cute.copy(tma_a, tAgA[(None, kt0 + prod.count)], tAsA[(None, prod.index)],
                          tma_bar_ptr=pipe.producer_get_barrier(prod))
                cute.copy(tma_b, tBgB[(None, kt0 + prod.count)], tBsB[(None, prod.index)],
                          tma_bar_ptr=pipe.producer_get_barrier(prod))
                pipe.producer_commit(prod)
                prod.advance()
        cC = thr_mma.partition_C(cute.local_tile(cute.make_identity_tensor(mCz.shape), self.tile,
                                                 (bm, bn, None), proj=(1, 1, None)))
        for i in cutlass.range_constexpr(cute.size(acc)):
            if cute.elem_less(cC[i], mCz.shape):
                tCgC[i] = acc[i].to(mC.element_type)


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
        for j in cutlass.range_constexpr((self.E * TB + 255) // 256):   # mask term: sum over the 8 choices
            idx = tidx + 256 * j
            if idx < self.E * TB:
                e = idx // TB
                tl = idx % TB
                t = cutlass.min(t0 + tl, ntok - 1)
                s = Float32(0.0)
                for k in cutlass.range_constexpr(TOP_K):
                    s = s + gmask[e, k, t].to(Float32)
                sbuf[e * PAD + tl] = s
        cute.arch.sync_threads()
        lane = tidx % 32
        warp = tidx // 32
        for r in cutlass.range_constexpr(TB // 8):
            tl = warp + 8 * r
            t = cutlass.min(t0 + tl, ntok - 1)
            S = top_sum[t, 0]
            my_id = Int32(-1)
            gwj = Float32(0.0)
            pj = Float32(0.0)
            if lane < TOP_K:
                my_id = Int32(ids[t, lane])
                gwj = gw[t, lane].to(Float32)
                pj = probs[t, my_id]
            a = gwj * pj
            for sh in cutlass.range_constexpr(3):                      # lanes 0..7 hold the 8 choices
                a = a + cute.arch.shuffle_sync_bfly(a, offset=1 << sh)
            dtop = gwj / S - a / (S * S)
            rp = cute.make_rmem_tensor((self.epl,), Float32)
            dp = cute.make_rmem_tensor((self.epl,), Float32)
            for c in cutlass.range_constexpr(self.epl):
                rp[c] = Float32(0.0)
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
                    rp[c] = probs[t, e]
                    dp[c] = dp[c] + sbuf[e * PAD + tl]
                    part = part + dp[c] * rp[c]
            tot = cute.arch.warp_reduction_sum(part)
            for c in cutlass.range_constexpr(self.epl):
                e = lane * self.epl + c
                if e < self.E:
                    v = (rp[c] * (dp[c] - tot) + glog[t, e].to(Float32)).to(dl.element_type)
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


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _prepare(x, w_router, probs, ids, top_sum, grad_w, grad_mask, grad_logits, arch=None):
    d, e = x.shape[1], w_router.shape[0]
    key = (d, e)
    if key not in _COMPILED:
        opts = f"--gpu-arch {arch or _arch()} --enable-tvm-ffi"
        stream = make_fake_stream(use_tvm_ffi_env_stream=True)
        t, z = cute.sym_int(), cute.sym_int()
        bf, f32 = cutlass.BFloat16, Float32

        def rows(dtype, shape):
            return make_fake_compact_tensor(dtype, shape, stride_order=tuple(range(len(shape) - 1, -1, -1)),
                                            assumed_align=16)

        def cols(dtype, shape):  # a transposed view of a row-major matrix
            return make_fake_compact_tensor(dtype, shape, stride_order=(0, 1), assumed_align=16)

        prep = cute.compile(Prep(e), rows(f32, (t, e)), rows(cutlass.Int64, (t, TOP_K)), rows(f32, (t, 1)),
                            rows(bf, (t, TOP_K)), rows(bf, (e, TOP_K, t)), rows(bf, (t, e)), rows(bf, (t, e)),
                            rows(bf, (e, t)), stream, options=opts)
        gemm_dx = cute.compile(Gemm(1 << 20), rows(bf, (t, e)), cols(bf, (d, e)), rows(bf, (1, t, d)),
                               stream, options=opts)
        gemm_dw = cute.compile(Gemm(SPLIT_KT), rows(bf, (e, t)), cols(bf, (d, t)), rows(f32, (z, e, d)),
                               stream, options=opts)
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
    splits = -(-t // (64 * SPLIT_KT))
    part = torch.empty(splits, e, d, dtype=torch.float32, device=dev)
    gemm_dw(dlt, x.contiguous().t(), part)
    dw = torch.empty(e, d, dtype=torch.bfloat16, device=dev)
    reduce(part, dw)
    return dx[0], dw
