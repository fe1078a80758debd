"""p52 FP8 block-scaled o_proj (Qwen3-VL, 7680 -> 7680) + bias in CuTe DSL, quantization in the DSL too.

out = dequant(x) @ dequant(W).T + bias; x and W arrive in bf16 and every step runs in CuTe DSL kernels:
Kernel 1 (RowQuant, from p56): x [T, 7680] to e4m3 per token per 128 channels: 16 lanes per block, 8 bf16
each (one 16-byte load), butterfly absmax over the 16 lanes, scale = max(amax, 1e-12) / 448 and codes =
e4m3(clamp(x / scale)) with IEEE divisions (div.rn.f32), bit for bit as the reference rounds them.
Kernel 2 (BlockQuant, from p56): W [N, K] in 128x128 blocks (the blocks of W.T are those of W transposed,
so the problem's W.T quantization gives the same codes, stored N-major as the GEMM reads them): one CTA
per block, 64 elements per thread in registers, CTA absmax, codes x / scale.
Kernel 3 (Fp8BlockGemm, the shipped p52 core unchanged): 64x128 CTA tiles, K blocks of 128 (= one scale
block): TMA loads into a 4-stage mbarrier pipeline, four WGMMA m64n128k32 e4m3 x e4m3 -> fp32 per K block
into a scratch accumulator, promoted into the fp32 main accumulator with x_scale[row, kb] *
w_scale[n-block, kb].  Epilogue: + bias in fp32, one rounding to bf16.
fp8 tensors travel as uint8 views and are re-typed to e4m3 inside the kernels; torch only allocates.
"""
import torch

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

BLOCK = 128
FP8_MAX = 448.0
MIN_AMAX = 1e-12
THREADS = 256
WARPS = THREADS // 32


def _codes(y, scale):
    """e4m3(clamp(y / scale, -448, 448)) of a Float32 TensorSSA (IEEE division, round to nearest even)."""
    q = y / scale
    q = cute.where(q > FP8_MAX, cute.full_like(q, FP8_MAX), q)
    q = cute.where(q < -FP8_MAX, cute.full_like(q, -FP8_MAX), q)
    return q.to(cutlass.Float8E4M3FN)


class RowQuant:
    """codes[r, :], scales[r, k // 128] of x [R, K] in 1x128 blocks (scale = max(amax, 1e-12) / 448)."""

    def __init__(self, k: int):
        self.nv = k // 8

    @cute.jit
    def __call__(self, x: cute.Tensor, codes: cute.Tensor, scales: cute.Tensor, stream):
        total = x.shape[0] * self.nv
        self.kernel(x, cute.recast_tensor(codes, cutlass.Float8E4M3FN), scales).launch(
            grid=[(total + THREADS - 1) // THREADS, 1, 1], block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, x: cute.Tensor, codes: cute.Tensor, scales: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        v = cutlass.min(bidx * THREADS + tidx, x.shape[0] * self.nv - 1)   # whole 16-lane groups shuffle
        row = v // self.nv
        c = v % self.nv
        rx = cute.make_rmem_tensor((8,), x.element_type)
        cute.autovec_copy(cute.zipped_divide(x[row, None], (8,))[None, c], rx)
        y = rx.load().to(Float32)
        amax = cute.where(y < 0.0, -y, y).reduce(cute.ReductionOp.MAX, Float32(0.0), 0)
        for k in cutlass.range_constexpr(4):
            amax = cute.arch.fmax(amax, cute.arch.shuffle_sync_bfly(amax, offset=8 >> k))
        scale = cute.arch.fmax(amax, Float32(MIN_AMAX)) / Float32(FP8_MAX)
        rq = cute.make_rmem_tensor((8,), cutlass.Float8E4M3FN)
        rq.store(_codes(y, scale))
        if bidx * THREADS + tidx < x.shape[0] * self.nv:
            cute.autovec_copy(rq, cute.zipped_divide(codes[row, None], (8,))[None, c])
            if c % 16 == 0:
                scales[row, c // 16] = scale


class BlockQuant:
    """codes, scales[n // 128, k // 128] of w [N, K] in 128x128 blocks: one CTA per block."""

    @cute.jit
    def __call__(self, w: cute.Tensor, codes: cute.Tensor, scales: cute.Tensor, stream):
        self.kernel(w, cute.recast_tensor(codes, cutlass.Float8E4M3FN), scales).launch(
            grid=[w.shape[1] // BLOCK, w.shape[0] // BLOCK, 1], block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, w: cute.Tensor, codes: cute.Tensor, scales: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        kb, nb, _ = cute.arch.block_idx()
        red = cutlass.memory.SmemAllocator().allocate_tensor(Float32, cute.make_layout(WARPS))
        per = BLOCK * BLOCK // 8 // THREADS                     # 8-element chunks per thread
        r = cute.make_rmem_tensor((8, per), w.element_type)
        amax = Float32(0.0)
        for i in cutlass.range_constexpr(per):
            j = i * THREADS + tidx
            cute.autovec_copy(cute.zipped_divide(w[nb * BLOCK + j // 16, None], (8,))[None, kb * 16 + j % 16],
                              r[None, i])
            y = r[None, i].load().to(Float32)
            amax = cute.arch.fmax(amax, cute.where(y < 0.0, -y, y).reduce(cute.ReductionOp.MAX, Float32(0.0), 0))
        amax = cute.arch.warp_reduction_max(amax)
        if tidx % 32 == 0:
            red[tidx // 32] = amax
        cute.arch.sync_threads()
        amax = Float32(0.0)
        for wi in cutlass.range_constexpr(WARPS):
            amax = cute.arch.fmax(amax, red[wi])
        scale = cute.arch.fmax(amax, Float32(MIN_AMAX)) / Float32(FP8_MAX)
        if tidx == 0:
            scales[nb, kb] = scale
        for i in cutlass.range_constexpr(per):
            j = i * THREADS + tidx
            rq = cute.make_rmem_tensor((8,), cutlass.Float8E4M3FN)
            rq.store(_codes(r[None, i].load().to(Float32), scale))
            cute.autovec_copy(rq, cute.zipped_divide(codes[nb * BLOCK + j // 16, None], (8,))[None, kb * 16 + j % 16])


class Fp8BlockGemm:
    """C(M,N) = (A(M,K) e4m3 * sa) @ (B(N,K) e4m3 * sb)^T [+ bias], 1x128 / 128x128 block scales."""

    def __init__(self, with_bias: bool, stages: int = 4):
        self.bm, self.bn = 64, 128
        self.stages = stages
        self.with_bias = with_bias

    @cute.jit
    def __call__(self, mA8: cute.Tensor, mSA: cute.Tensor, mB8: cute.Tensor, mSB: cute.Tensor,
                 mBias: cute.Tensor, mC: cute.Tensor, stream):
        f8 = cutlass.Float8E4M3FN
        mA = cute.make_tensor(cute.recast_ptr(mA8.iterator, dtype=f8), mA8.layout)
        mB = cute.make_tensor(cute.recast_ptr(mB8.iterator, dtype=f8), mB8.layout)
        a_l, b_l = utils.LayoutEnum.from_tensor(mA), utils.LayoutEnum.from_tensor(mB)
        tiled_mma = sm90_utils.make_trivial_tiled_mma(
            f8, f8, a_l.sm90_mma_major_mode(), b_l.sm90_mma_major_mode(), Float32, (1, 1, 1),
            tiler_mn=(64, self.bn))
        bk = cute.size(tiled_mma.shape_mnk, mode=[2]) * 4          # 4 x k32 = 128 = one scale block
        tile = (self.bm, self.bn, bk)
        sA_l = sm90_utils.make_smem_layout_a(a_l, tile, f8, self.stages)
        sB_l = sm90_utils.make_smem_layout_b(b_l, tile, f8, self.stages)
        tma_a, gA_tma = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mA,
                                                    cute.slice_(sA_l, (None, None, 0)), (self.bm, bk))
        tma_b, gB_tma = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mB,
                                                    cute.slice_(sB_l, (None, None, 0)), (self.bn, bk))

        @cute.struct
        class Smem:
            mbar: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            sA: cute.struct.Align[cute.struct.MemRange[f8, cute.cosize(sA_l)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[f8, cute.cosize(sB_l)], 1024]
        self.smem_t = Smem
        self.ab_dtype = f8
        self.tile = tile
        grid = (cute.ceil_div(mC.shape[0], self.bm), cute.ceil_div(mC.shape[1], self.bn), 1)
        self.kernel(tma_a, gA_tma, tma_b, gB_tma, mSA, mSB, mBias, mC, tiled_mma, sA_l, sB_l).launch(
            grid=grid, block=[128, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom, mB: cute.Tensor,
               mSA: cute.Tensor, mSB: cute.Tensor, mBias: cute.Tensor, mC: cute.Tensor, tiled_mma: cute.TiledMma,
               sA_l: cute.ComposedLayout, sB_l: cute.ComposedLayout):
        tidx, _, _ = cute.arch.thread_idx()
        bm, bn, _ = cute.arch.block_idx()
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
        cC = thr_mma.partition_C(cute.local_tile(cute.make_identity_tensor(mC.shape), self.tile,
                                                 (bm, bn, None), proj=(1, 1, None)))
        acc = cute.make_rmem_tensor(tCgC.shape, Float32)
        tmp = cute.make_rmem_tensor(tCgC.shape, Float32)
        acc.fill(0.0)
        # this thread's two accumulator rows (m64 fragments: rows r0 and r0 + 8)
        r0 = cutlass.min(cutlass.min(cC[0][0], cC[1][0]), cutlass.min(cC[2][0], cC[3][0]))
        ra = cutlass.min(r0, mC.shape[0] - 1)
        rb = cutlass.min(r0 + 8, mC.shape[0] - 1)
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
            sbv = mSB[bn, kt]
            s0 = mSA[ra, kt] * sbv
            s1 = mSA[rb, kt] * sbv
            pipe.consumer_wait(cons)
            tiled_mma.set(warpgroup.Field.ACCUMULATE, False)
            warpgroup.fence()
            for kb in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
                cute.gemm(tiled_mma, tmp, tCrA[None, None, kb, cons.index], tCrB[None, None, kb, cons.index], tmp)
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
            for i in cutlass.range_constexpr(cute.size(acc)):
                sc = s1
                if cC[i][0] == r0:
                    sc = s0
                acc[i] = acc[i] + tmp[i] * sc
        if cutlass.const_expr(self.with_bias):
            mBiasMN = cute.make_tensor(mBias.iterator, cute.make_layout(mC.shape, stride=(0, 1)))
            tBias = thr_mma.partition_C(cute.local_tile(mBiasMN, self.tile, (bm, bn, None), proj=(1, 1, None)))
            for i in cutlass.range_constexpr(cute.size(acc)):
                if cute.elem_less(cC[i], mC.shape):
                    tCgC[i] = (acc[i] + tBias[i].to(Float32)).to(mC.element_type)
        else:
            for i in cutlass.range_constexpr(cute.size(acc)):
                if cute.elem_less(cC[i], mC.shape):
                    tCgC[i] = acc[i].to(mC.element_type)


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _fake_gemm_args(k: int, n: int):
    m = cute.sym_int()
    u8, bf = cutlass.Uint8, cutlass.BFloat16
    return [make_fake_compact_tensor(u8, (m, k), stride_order=(1, 0), assumed_align=16),
            make_fake_compact_tensor(Float32, (m, k // BLOCK), stride_order=(1, 0)),
            make_fake_compact_tensor(u8, (n, k), stride_order=(1, 0), assumed_align=16),
            make_fake_compact_tensor(Float32, (n // BLOCK, k // BLOCK), stride_order=(1, 0)),
            make_fake_compact_tensor(bf, (n,), assumed_align=16),
            make_fake_compact_tensor(bf, (m, n), stride_order=(1, 0), assumed_align=16),
            make_fake_stream(use_tvm_ffi_env_stream=True)]


def _prepare(x, weight, bias, arch=None):
    k, n = x.shape[1], weight.shape[0]
    assert k % BLOCK == 0 and n % BLOCK == 0 and weight.shape[1] == k, (x.shape, weight.shape)
    if (k, n) not in _COMPILED:
        opts = f"--gpu-arch {arch or _arch()} --enable-tvm-ffi"
        stream = make_fake_stream(use_tvm_ffi_env_stream=True)
        m = cute.sym_int()
        u8, bf = cutlass.Uint8, cutlass.BFloat16
        row_quant = cute.compile(RowQuant(k),
                                 make_fake_compact_tensor(bf, (m, k), stride_order=(1, 0), assumed_align=16),
                                 make_fake_compact_tensor(u8, (m, k), stride_order=(1, 0), assumed_align=16),
                                 make_fake_compact_tensor(Float32, (m, k // BLOCK), stride_order=(1, 0)),
                                 stream, options=opts)
        block_quant = cute.compile(BlockQuant(),
                                   make_fake_compact_tensor(bf, (n, k), stride_order=(1, 0), assumed_align=16),
                                   make_fake_compact_tensor(u8, (n, k), stride_order=(1, 0), assumed_align=16),
                                   make_fake_compact_tensor(Float32, (n // BLOCK, k // BLOCK), stride_order=(1, 0)),
                                   stream, options=opts)
        gemm = cute.compile(Fp8BlockGemm(with_bias=True), *_fake_gemm_args(k, n), options=opts)
        _COMPILED[(k, n)] = (row_quant, block_quant, gemm)
    return list(_COMPILED[(k, n)])


def solve(x, weight, bias):
    row_quant, block_quant, gemm = _prepare(x, weight, bias)
    (t, k), n, dev = x.shape, weight.shape[0], x.device
    xq = torch.empty(t, k, dtype=torch.uint8, device=dev)
    xs = torch.empty(t, k // BLOCK, dtype=torch.float32, device=dev)
    row_quant(x.contiguous(), xq, xs)
    wq = torch.empty(n, k, dtype=torch.uint8, device=dev)
    ws = torch.empty(n // BLOCK, k // BLOCK, dtype=torch.float32, device=dev)
    block_quant(weight.contiguous(), wq, ws)
    out = torch.empty(t, n, dtype=x.dtype, device=dev)
    gemm(xq, xs, wq, ws, bias.contiguous(), out)
    return out
