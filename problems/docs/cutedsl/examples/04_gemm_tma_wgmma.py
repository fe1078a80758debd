"""C = A @ B^T on Hopper tensor cores: TMA loads, an mbarrier pipeline and wgmma (guide chapters 05-06).

A: (M, K) bf16 and B: (N, K) bf16, both K-major (row-major, K contiguous); C: (M, N) bf16, fp32
accumulation. One warpgroup (128 threads) computes a 128x128 tile of C; TMA fills a 4-stage ring of
shared-memory buffers while wgmma consumes them. sm_90a only. Requires K % 8 == 0 (TMA strides are
multiples of 16 bytes). Deliberately simple: no warp specialization, no TMA-store epilogue, and each
stage's MMAs are retired before the stage is refilled (see the guide for what a fast GEMM adds).
"""

import torch

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.memory import SmemAllocator
from cutlass.tensor_utils import LayoutEnum
from cute_util import env_stream, fake_matrix, main, options


class HopperGemm:
    def __init__(self, tile_mn=(128, 128), stages=4):
        self.bm, self.bn = tile_mn
        self.stages = stages

    @cute.jit
    def __call__(self, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, stream):
        a_enum, b_enum = LayoutEnum.from_tensor(mA), LayoutEnum.from_tensor(mB)  # both K-major here
        tiled_mma = sm90_utils.make_trivial_tiled_mma(mA.element_type, mB.element_type, a_enum.sm90_mma_major_mode(),
                                                      b_enum.sm90_mma_major_mode(), Float32, (1, 1, 1),
                                                      tiler_mn=(64, self.bn))
        bk = cute.size(tiled_mma.shape_mnk, mode=[2]) * 4  # 4 wgmma k-steps (k16 each) per stage = 64
        self.tile = (self.bm, self.bn, bk)
        sA_l = sm90_utils.make_smem_layout_a(a_enum, self.tile, mA.element_type, self.stages)  # swizzled
        sB_l = sm90_utils.make_smem_layout_b(b_enum, self.tile, mB.element_type, self.stages)
        tma_a, gA = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mA,
                                                cute.slice_(sA_l, (None, None, 0)), (self.bm, bk))
        tma_b, gB = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mB,
                                                cute.slice_(sB_l, (None, None, 0)), (self.bn, bk))

        @cute.struct
        class Smem:
            mbar: cute.struct.MemRange[cutlass.Int64, self.stages * 2]  # full + empty barrier per stage
            sA: cute.struct.Align[cute.struct.MemRange[mA.element_type, cute.cosize(sA_l)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[mB.element_type, cute.cosize(sB_l)], 1024]

        self.smem_t = Smem
        self.ab_dtype = mA.element_type  # inside the kernel, gA/gB are TMA coordinate tensors
        grid = (cute.ceil_div(mC.shape[0], self.bm), cute.ceil_div(mC.shape[1], self.bn), 1)
        self.kernel(tma_a, gA, tma_b, gB, mC, tiled_mma, sA_l, sB_l).launch(grid=grid, block=[128, 1, 1],
                                                                             stream=stream)

    @cute.kernel
    def kernel(self, tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom, mB: cute.Tensor,
               mC: cute.Tensor, tiled_mma: cute.TiledMma, sA_l: cute.ComposedLayout, sB_l: cute.ComposedLayout):
        tidx, _, _ = cute.arch.thread_idx()
        bm, bn, _ = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp == 0:
            cpasync.prefetch_descriptor(tma_a)
            cpasync.prefetch_descriptor(tma_b)
        storage = SmemAllocator().allocate(self.smem_t)
        stage_bytes = cute.size_in_bytes(self.ab_dtype, cute.slice_(sA_l, (None, None, 0))) + \
            cute.size_in_bytes(self.ab_dtype, cute.slice_(sB_l, (None, None, 0)))
        pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar.data_ptr(), num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 4),  # the 4 warps release
            tx_count=stage_bytes, cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)))
        sA = storage.sA.get_tensor(sA_l.outer, swizzle=sA_l.inner)
        sB = storage.sB.get_tensor(sB_l.outer, swizzle=sB_l.inner)
        gA = cute.local_tile(mA, self.tile, (bm, bn, None), proj=(1, None, 1))  # (BM, BK, k_tiles)
        gB = cute.local_tile(mB, self.tile, (bm, bn, None), proj=(None, 1, 1))  # (BN, BK, k_tiles)
        gC = cute.local_tile(mC, self.tile, (bm, bn, None), proj=(1, 1, None))  # (BM, BN)
        tAsA, tAgA = cpasync.tma_partition(tma_a, 0, cute.make_layout(1), cute.group_modes(sA, 0, 2),
                                           cute.group_modes(gA, 0, 2))
        tBsB, tBgB = cpasync.tma_partition(tma_b, 0, cute.make_layout(1), cute.group_modes(sB, 0, 2),
                                           cute.group_modes(gB, 0, 2))
        thr_mma = tiled_mma.get_slice(tidx)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))  # shared-memory descriptors
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
        tCgC = thr_mma.partition_C(gC)
        acc = cute.make_rmem_tensor(tCgC.shape, Float32)
        acc.fill(0.0)
        k_tiles = cute.size(gA, mode=[2])
        prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        cons = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)

        if warp == 0:  # prologue: fill up to `stages` slots
            for _ in cutlass.range(cutlass.min(self.stages, k_tiles), unroll=1):
                pipe.producer_acquire(prod)
                cute.copy(tma_a, tAgA[(None, prod.count)], tAsA[(None, prod.index)],
                          tma_bar_ptr=pipe.producer_get_barrier(prod))
                cute.copy(tma_b, tBgB[(None, prod.count)], tBsB[(None, prod.index)],
                          tma_bar_ptr=pipe.producer_get_barrier(prod))
                pipe.producer_commit(prod)
                prod.advance()

        tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
        for _ in cutlass.range(k_tiles, unroll=1):
            pipe.consumer_wait(cons)  # TMA bytes of this stage have landed
            warpgroup.fence()
            for kb in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
                cute.gemm(tiled_mma, acc, tCrA[None, None, kb, cons.index], tCrB[None, None, kb, cons.index], acc)
            warpgroup.commit_group()
            warpgroup.wait_group(0)  # simple and safe: retire this stage's MMAs before freeing it
            pipe.consumer_release(cons)
            cons.advance()
            if warp == 0 and prod.count < k_tiles:  # refill the freed slot
                pipe.producer_acquire(prod)
                cute.copy(tma_a, tAgA[(None, prod.count)], tAsA[(None, prod.index)],
                          tma_bar_ptr=pipe.producer_get_barrier(prod))
                cute.copy(tma_b, tBgB[(None, prod.count)], tBsB[(None, prod.index)],
                          tma_bar_ptr=pipe.producer_get_barrier(prod))
                pipe.producer_commit(prod)
                prod.advance()

        # epilogue in registers: bounds-checked, converted, stored straight to global memory
        cC = thr_mma.partition_C(cute.local_tile(cute.make_identity_tensor(mC.shape), self.tile, (bm, bn, None),
                                                 proj=(1, 1, None)))
        for i in cutlass.range_constexpr(cute.size(acc)):
            if cute.elem_less(cC[i], mC.shape):
                tCgC[i] = acc[i].to(mC.element_type)


def build(arch: str = "sm_90a", keep_dir: str | None = None):
    m, n, k = cute.sym_int(), cute.sym_int(divisibility=8), cute.sym_int(divisibility=8)
    bf16 = cutlass.BFloat16
    return cute.compile(HopperGemm(), fake_matrix(bf16, m, k), fake_matrix(bf16, n, k), fake_matrix(bf16, m, n),
                        env_stream(), options=options(arch, keep_dir))


def check(fn):
    for m, n, k in ((64, 64, 64), (1000, 1032, 520), (4096, 4096, 4096)):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        fn(a, b, c)
        torch.cuda.synchronize()
        ref = a.float() @ b.float().T
        torch.testing.assert_close(c.float(), ref, atol=0.05 * (k ** 0.5) / 8, rtol=2e-2)
    return lambda: fn(a, b, c)


if __name__ == "__main__":
    raise SystemExit(main(build, check))
