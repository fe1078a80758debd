"""p53 FP8 block-scaled gate/up projections + SiLU gating (3584 -> 2 x 18944) in CuTe DSL, relayout in the DSL too.

Kernel 1 (Relayout, two launches): the problem gives the gate and up weights K-major ([3584, 18944] e4m3
each, 128x128 scales [28, 148]); FP8 WGMMA reads both operands K-major only, so each 128x128 block is
transposed through shared memory (16-byte coalesced loads of 128 K rows, byte gathers down the columns,
16-byte stores) into one stacked N-major [2 x 18944, 3584] code matrix (gate rows first), and its scale
is written transposed into the stacked [296, 28] scales.  Codes are moved as bytes: bit for bit.
Kernel 2 (Fp8BlockGemm, the shipped p53 core unchanged): h = dequant(x) @ dequant(W).T on tensor cores:
64x128 CTA tiles, TMA into a 4-stage mbarrier pipeline, four WGMMA m64n128k32 e4m3 x e4m3 -> fp32 per
128-wide K block into a scratch accumulator promoted into the fp32 accumulator with
x_scale[row, kb] * w_scale[n-block, kb]; h is stored in bf16.
Kernel 3 (SwiGLU, shipped): out = silu(h[:, :I]) * h[:, I:] in fp32 (128-bit accesses), rounded to bf16.
fp8 tensors travel as uint8 views and are re-typed to e4m3 inside the GEMM; torch only allocates.
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
THREADS = 256
VEC = 8


ROW_PAD = 144                 # shared-memory row stride of a staged block (16-byte rows, fewer bank conflicts)
CHUNKS = BLOCK * BLOCK // 16 // THREADS   # 16-byte chunks per thread and phase


class Relayout:
    """dst[n, k] = src[k, n] (uint8 codes) and dst_scales[nb, kb] = src_scales[kb, nb]: one CTA per 128x128 block."""

    @cute.jit
    def __call__(self, src: cute.Tensor, src_scales: cute.Tensor, dst: cute.Tensor, dst_scales: cute.Tensor, stream):
        self.kernel(src, src_scales, dst, dst_scales).launch(
            grid=[src.shape[0] // BLOCK, src.shape[1] // BLOCK, 1], block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, src: cute.Tensor, src_scales: cute.Tensor, dst: cute.Tensor, dst_scales: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        kb, nb, _ = cute.arch.block_idx()
        tile = cutlass.memory.SmemAllocator().allocate_tensor(
            cutlass.Uint8, cute.make_layout((BLOCK, ROW_PAD), stride=(ROW_PAD, 1)), byte_alignment=16)
        if tidx == 0:
            dst_scales[nb, kb] = src_scales[kb, nb]
        for i in cutlass.range_constexpr(CHUNKS):      # chunk j: K row j // 8, N bytes (j % 8) * 16 ..
            j = i * THREADS + tidx
            r = cute.make_rmem_tensor((16,), cutlass.Uint8)
            cute.autovec_copy(cute.zipped_divide(src[kb * BLOCK + j // 8, None], (16,))[None, nb * 8 + j % 8], r)
            cute.autovec_copy(r, cute.zipped_divide(tile[j // 8, None], (16,))[None, j % 8])
        cute.arch.sync_threads()
        for i in cutlass.range_constexpr(CHUNKS):      # chunk j: N row j % 128, K bytes (j // 128) * 16 ..
            j = i * THREADS + tidx
            n = j % BLOCK
            k0 = (j // BLOCK) * 16
            o = cute.make_rmem_tensor((16,), cutlass.Uint8)
            for e in cutlass.range_constexpr(16):
                o[e] = tile[k0 + e, n]
            cute.autovec_copy(o, cute.zipped_divide(dst[nb * BLOCK + n, None], (16,))[None, kb * 8 + j // BLOCK])


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


class SwiGLU:
    def __init__(self, inter: int):
        self.I = inter
        self.nv = inter // VEC

    @cute.jit
    def __call__(self, h: cute.Tensor, out: cute.Tensor, stream):
        total = out.shape[0] * self.nv
        self.kernel(h, out).launch(grid=[(total + THREADS - 1) // THREADS, 1, 1], block=[THREADS, 1, 1],
                                   stream=stream)

    @cute.kernel
    def kernel(self, h: cute.Tensor, out: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        v = bidx * THREADS + tidx
        if v < out.shape[0] * self.nv:
            row = v // self.nv
            c = v % self.nv
            hrow = cute.zipped_divide(h[row, None], (VEC,))
            rg = cute.make_rmem_tensor((VEC,), h.element_type)
            ru = cute.make_rmem_tensor((VEC,), h.element_type)
            cute.autovec_copy(hrow[None, c], rg)
            cute.autovec_copy(hrow[None, self.nv + c], ru)
            g = rg.load().to(Float32)
            y = g / (1.0 + cute.math.exp(-g)) * ru.load().to(Float32)
            ro = cute.make_rmem_tensor((VEC,), out.element_type)
            ro.store(y.to(out.element_type))
            cute.autovec_copy(ro, cute.zipped_divide(out[row, None], (VEC,))[None, c])


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _prepare(qx, scale_x, qw_gate, scale_gate, qw_up, scale_up, arch=None):
    k, inter = qw_gate.shape
    n = 2 * inter
    assert qx.shape[1] == k and qw_up.shape == (k, inter), (qx.shape, qw_gate.shape, qw_up.shape)
    assert k % BLOCK == 0 and inter % BLOCK == 0 and inter % VEC == 0, (k, inter)
    if (k, n) not in _COMPILED:
        opts = f"--gpu-arch {arch or _arch()} --enable-tvm-ffi"
        m = cute.sym_int()
        u8, bf = cutlass.Uint8, cutlass.BFloat16
        stream = make_fake_stream(use_tvm_ffi_env_stream=True)
        relayout = cute.compile(Relayout(),
                                make_fake_compact_tensor(u8, (k, inter), stride_order=(1, 0), assumed_align=16),
                                make_fake_compact_tensor(Float32, (k // BLOCK, inter // BLOCK), stride_order=(1, 0)),
                                make_fake_compact_tensor(u8, (inter, k), stride_order=(1, 0), assumed_align=16),
                                make_fake_compact_tensor(Float32, (inter // BLOCK, k // BLOCK), stride_order=(1, 0)),
                                stream, options=opts)
        fh = make_fake_compact_tensor(bf, (m, n), stride_order=(1, 0), assumed_align=16)
        gemm = cute.compile(Fp8BlockGemm(with_bias=False),
                            make_fake_compact_tensor(u8, (m, k), stride_order=(1, 0), assumed_align=16),
                            make_fake_compact_tensor(Float32, (m, k // BLOCK), stride_order=(1, 0)),
                            make_fake_compact_tensor(u8, (n, k), stride_order=(1, 0), assumed_align=16),
                            make_fake_compact_tensor(Float32, (n // BLOCK, k // BLOCK), stride_order=(1, 0)),
                            make_fake_compact_tensor(bf, (n,), assumed_align=16), fh, stream, options=opts)
        act = cute.compile(SwiGLU(inter), fh,
                           make_fake_compact_tensor(bf, (m, inter), stride_order=(1, 0), assumed_align=16),
                           stream, options=opts)
        _COMPILED[(k, n)] = (relayout, gemm, act)
    return list(_COMPILED[(k, n)])


def solve(qx, scale_x, qw_gate, scale_gate, qw_up, scale_up):
    relayout, gemm, act = _prepare(qx, scale_x, qw_gate, scale_gate, qw_up, scale_up)
    (tokens, k), inter, dev = qx.shape, qw_gate.shape[1], qx.device
    w = torch.empty(2 * inter, k, dtype=torch.uint8, device=dev)      # [W_gate.T; W_up.T] codes, N-major
    ws = torch.empty(2 * inter // BLOCK, k // BLOCK, dtype=torch.float32, device=dev)
    half = inter // BLOCK
    relayout(qw_gate.view(torch.uint8), scale_gate, w[:inter], ws[:half])
    relayout(qw_up.view(torch.uint8), scale_up, w[inter:], ws[half:])
    h = torch.empty(tokens, 2 * inter, dtype=torch.bfloat16, device=dev)
    unused_bias = torch.empty(2 * inter, dtype=torch.bfloat16, device=dev)     # no-bias epilogue
    gemm(qx.view(torch.uint8), scale_x, w, ws, unused_bias, h)
    out = torch.empty(tokens, inter, dtype=torch.bfloat16, device=dev)
    act(h, out)
    return out
