"""p60 NVFP4 x NVFP4 GEMM (Nemotron Mamba2 out_proj, 8192 x 1920 x 1920, fp32 out) in CuTe DSL.

Hopper has no FP4 tensor cores, but every e2m1 value times its e4m3 block scale is exact in bf16 (2 + 4
significant bits, exponents well inside the range).  Kernel 1 decodes each packed operand to bf16
a' = e2m1 * block_scale (one thread per 32 elements: one 16-byte load of codes, two scale bytes, four
16-byte stores; the e2m1 and e4m3 bit patterns are decoded with integer arithmetic only).
Kernel 2 is a bf16 WGMMA GEMM (64x128 CTA tiles, TMA into a 4-stage mbarrier pipeline): one
m64n128k16 WGMMA per 16-wide scale block into a scratch accumulator.  Within a block all products
share the factor sa[row] * sw[col], so the block's partial sum is an exact multiple of it (< 2^20
ulps): the tensor core returns it exactly, and the fp32 promotion acc += tmp is the only rounding
(120 correctly rounded additions per output instead of the reference's 1920).  The epilogue
multiplies by the two global decode scales and stores fp32.
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

THREADS = 256
CHUNK = 32                                   # elements per decode thread: two 16-wide scale blocks
E2M1_TWICE = 0xC8643210 - (1 << 32)          # nibble m = 2 * |e2m1 value of magnitude code m|


def _e2m1_twice(code):
    """2 * the e2m1 value of a 4-bit code (sign bit 8), as an Int32 in [-12, 12]."""
    mag = (Int32(E2M1_TWICE) >> ((code & 7) * 4)) & 15
    return mag * (1 - ((code >> 2) & 2))


def _e4m3_value(byte):
    """The non-negative e4m3fn number with bit pattern `byte`, exactly, as Float32."""
    e = byte >> 3
    mant = (byte & 7) + 8 * cutlass.min(e, 1)
    return Float32(mant * (Int32(1) << (cutlass.max(e, 1) - 1))) * Float32(2.0 ** -9)


class Nvfp4Decode:
    """out[r, k] = e2m1(code[r, k]) * scale[r, k // 16] in bf16 (exact)."""

    def __init__(self, k: int):
        self.nv = k // CHUNK

    @cute.jit
    def __call__(self, packed: cute.Tensor, scales: cute.Tensor, out: cute.Tensor, stream):
        total = out.shape[0] * self.nv
        self.kernel(packed, scales, out).launch(grid=[(total + THREADS - 1) // THREADS, 1, 1],
                                                block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, packed: cute.Tensor, scales: cute.Tensor, out: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        v = bidx * THREADS + tidx
        if v < out.shape[0] * self.nv:
            row = v // self.nv
            c = v % self.nv
            rp = cute.make_rmem_tensor((CHUNK // 2,), cutlass.Uint8)
            cute.autovec_copy(cute.zipped_divide(packed[row, None], (CHUNK // 2,))[None, c], rp)
            ro = cute.make_rmem_tensor((CHUNK,), out.element_type)
            for blk in cutlass.range_constexpr(2):
                half = _e4m3_value(Int32(scales[row, 2 * c + blk])) * Float32(0.5)
                for i in cutlass.range_constexpr(8):
                    b = Int32(rp[blk * 8 + i])
                    ro[blk * 16 + 2 * i] = (Float32(_e2m1_twice(b & 15)) * half).to(out.element_type)
                    ro[blk * 16 + 2 * i + 1] = (Float32(_e2m1_twice(b >> 4)) * half).to(out.element_type)
            cute.autovec_copy(ro, cute.zipped_divide(out[row, None], (CHUNK,))[None, c])


class ScaledGemm:
    """C(M,N) = (A(M,K) @ B(N,K)^T) * ga * gb, bf16 operands, fp32 accumulation.  With `promote`, every
    k16 step goes through a scratch accumulator and is added to the main one in fp32 (exact block dots)."""

    def __init__(self, promote: bool, stages: int = 4):
        self.bm, self.bn = 64, 128
        self.stages = stages
        self.promote = promote

    @cute.jit
    def __call__(self, mA: cute.Tensor, mB: cute.Tensor, mGA: cute.Tensor, mGB: cute.Tensor, mC: cute.Tensor,
                 stream):
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
        self.kernel(tma_a, gA_tma, tma_b, gB_tma, mGA, mGB, mC, tiled_mma, sA_l, sB_l).launch(
            grid=grid, block=[128, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom, mB: cute.Tensor,
               mGA: cute.Tensor, mGB: cute.Tensor, mC: cute.Tensor, tiled_mma: cute.TiledMma,
               sA_l: cute.ComposedLayout, sB_l: cute.ComposedLayout):
        tidx, _, _ = cute.arch.thread_idx()
        bn, bm, _ = cute.arch.block_idx()
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
            if cutlass.const_expr(self.promote):
                for kb in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
                    tiled_mma.set(warpgroup.Field.ACCUMULATE, False)
                    warpgroup.fence()
                    cute.gemm(tiled_mma, tmp, tCrA[None, None, kb, cons.index], tCrB[None, None, kb, cons.index], tmp)
                    warpgroup.commit_group()
                    warpgroup.wait_group(0)
                    for i in cutlass.range_constexpr(cute.size(acc)):
                        acc[i] = acc[i] + tmp[i]
            else:
                tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
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
        g = mGA[0] * mGB[0]
        for i in cutlass.range_constexpr(cute.size(acc)):
            if cute.elem_less(cC[i], mC.shape):
                tCgC[i] = (acc[i] * g).to(mC.element_type)


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _prepare(a_packed, a_scale, a_global, w_packed, w_scale, w_global, arch=None):
    k, n = 2 * a_packed.shape[-1], w_packed.shape[-2]
    assert k % CHUNK == 0 and w_packed.shape[-1] * 2 == k, (a_packed.shape, w_packed.shape)
    if (k, n) not in _COMPILED:
        opts = f"--gpu-arch {arch or _arch()} --enable-tvm-ffi"
        stream = make_fake_stream(use_tvm_ffi_env_stream=True)
        rows, m = cute.sym_int(), cute.sym_int()
        u8, bf = cutlass.Uint8, cutlass.BFloat16
        decode = cute.compile(Nvfp4Decode(k),
                              make_fake_compact_tensor(u8, (rows, k // 2), stride_order=(1, 0), assumed_align=16),
                              make_fake_compact_tensor(u8, (rows, k // 16), stride_order=(1, 0)),
                              make_fake_compact_tensor(bf, (rows, k), stride_order=(1, 0), assumed_align=16),
                              stream, options=opts)
        one = make_fake_compact_tensor(Float32, (1,))
        gemm = cute.compile(ScaledGemm(promote=True),
                            make_fake_compact_tensor(bf, (m, k), stride_order=(1, 0), assumed_align=16),
                            make_fake_compact_tensor(bf, (n, k), stride_order=(1, 0), assumed_align=16),
                            one, one, make_fake_compact_tensor(Float32, (m, n), stride_order=(1, 0), assumed_align=16),
                            stream, options=opts)
        _COMPILED[(k, n)] = (decode, gemm)
    return list(_COMPILED[(k, n)])


def _decoded(decode, packed, scale):
    rows, half = packed.shape[-2], packed.shape[-1]
    out = torch.empty(rows, 2 * half, dtype=torch.bfloat16, device=packed.device)
    decode(packed.reshape(rows, half).contiguous(), scale.reshape(rows, -1).contiguous().view(torch.uint8), out)
    return out


def solve(a_packed, a_scale, a_global, w_packed, w_scale, w_global):
    decode, gemm = _prepare(a_packed, a_scale, a_global, w_packed, w_scale, w_global)
    a = _decoded(decode, a_packed, a_scale)
    w = _decoded(decode, w_packed, w_scale)
    out = torch.empty(a.shape[0], w.shape[0], dtype=torch.float32, device=a.device)
    gemm(a, w, a_global.reshape(1).to(torch.float32), w_global.reshape(1).to(torch.float32), out)
    return out.view(*a_packed.shape[:-1], w.shape[0])
