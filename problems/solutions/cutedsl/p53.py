"""p53 FP8 block-scaled gate/up projections + SiLU gating (3584 -> 2 x 18944) in CuTe DSL, relayout in the DSL too.

Kernel 1 (Relayout, two launches): the problem gives the gate and up weights K-major ([3584, 18944] e4m3
each); FP8 WGMMA reads both operands K-major only, so each 128x128 block is transposed through shared
memory (16-byte coalesced loads of 128 K rows, byte gathers down the columns, 16-byte stores) into one
N-major [2 x 18944, 3584] code matrix that interleaves 64-row groups: rows 128t .. 128t + 63 are gate
outputs 64t .. 64t + 63 and rows 128t + 64 .. 128t + 127 the up outputs of the same columns (the up launch
writes through a view offset by 64 rows).  Codes are moved as bytes: bit for bit.  The 128x128 scales are
read in place ([28, 148] each): B-row tile t uses column t // 2 of the gate and of the up scales.
Kernel 2 (Fp8GemmWS): a persistent, warp-specialised GEMM over 128 x 128 tiles (128 tokens x 64 outputs,
gate and up) in grouped order (16 row tiles walk the column tiles together, so A and B bands are reused
in L2): one producer warp issues the TMA loads of A and B into a 6-stage mbarrier ring and runs ahead
across tiles; two consumer warpgroups (64 rows each, setmaxnreg 232 / 40) issue four WGMMA m64n128k32 e4m3
x e4m3 -> fp32 per 128-wide K block into a scratch fragment, wait, hand the stage back, and promote it
into the fp32 accumulator with x_scale[row, kb] * w_scale (the shipped kernel's arithmetic and order).
Epilogue: silu(gate) * up in fp32 on the thread's own gate/up pairs (fragment columns c and c + 64), one
rounding to bf16, stored as bf16 pairs: h never goes to memory.
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
HALF = 64                         # outputs per tile: 64 gate rows + 64 up rows of B
TILE_M, TILE_N = 128, 128         # A rows x B rows per CTA tile; K block 128 = one scale block
STAGES = 6                        # 6 x 32 KB of A + B tiles in shared memory
GROUP = 16                        # row tiles per raster group
THREADS_WS = 384                  # producer warpgroup + two consumer warpgroups
CONSUMER_WARPS = 8
PRODUCER_REGS, CONSUMER_REGS = 40, 232
H200_SMS = 132                    # multiprocessors of the target when compiling without a GPU
ROW_PAD = 144                     # shared-memory row stride of a staged block (16-byte rows, fewer bank conflicts)
CHUNKS = BLOCK * BLOCK // 16 // THREADS   # 16-byte chunks per thread and phase


class Relayout:
    """dst[256 nb + 128 (n // 64) + n % 64, k] = src[k, 128 nb + n] (uint8 codes): one CTA per 128x128 block."""

    @cute.jit
    def __call__(self, src: cute.Tensor, dst: cute.Tensor, stream):
        self.kernel(src, dst).launch(
            grid=[src.shape[0] // BLOCK, src.shape[1] // BLOCK, 1], block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, src: cute.Tensor, dst: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        kb, nb, _ = cute.arch.block_idx()
        tile = cutlass.memory.SmemAllocator().allocate_tensor(
            cutlass.Uint8, cute.make_layout((BLOCK, ROW_PAD), stride=(ROW_PAD, 1)), byte_alignment=16)
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
            drow = nb * 2 * BLOCK + (n // HALF) * BLOCK + n % HALF
            cute.autovec_copy(o, cute.zipped_divide(dst[drow, None], (16,))[None, kb * 8 + j // BLOCK])


class Fp8GemmWS:
    """out(M,I) = silu(gate) * up, [gate | up] = (A(M,K) e4m3 * sa) @ (B(2I,K) e4m3 * sb)^T: persistent,
    warp-specialised, 128 x 128 B-row tiles (B interleaves 64 gate rows and the 64 matching up rows).

    Warpgroup 0 loads (warp 0 issues the TMA copies of A and B into a STAGES-deep mbarrier ring); warpgroups
    1 and 2 each own 64 rows of the tile: per 128-wide K block four WGMMA m64n128k32 into a zeroed scratch
    fragment, wait, release the stage, promote into the fp32 accumulator with sa[row, kb] * s_gate[kb, nb]
    (fragment columns 0-63) or sa[row, kb] * s_up[kb, nb] (columns 64-127).
    """

    def __init__(self, sms: int):
        self.bm, self.bn = TILE_M, TILE_N
        self.stages = STAGES
        self.sms = sms

    @cute.jit
    def __call__(self, mA8: cute.Tensor, mSA: cute.Tensor, mB8: cute.Tensor, mSG: cute.Tensor,
                 mSU: cute.Tensor, mC: cute.Tensor, stream):
        f8 = cutlass.Float8E4M3FN
        mA = cute.make_tensor(cute.recast_ptr(mA8.iterator, dtype=f8), mA8.layout)
        mB = cute.make_tensor(cute.recast_ptr(mB8.iterator, dtype=f8), mB8.layout)
        a_l, b_l = utils.LayoutEnum.from_tensor(mA), utils.LayoutEnum.from_tensor(mB)
        tiled_mma = sm90_utils.make_trivial_tiled_mma(
            f8, f8, a_l.sm90_mma_major_mode(), b_l.sm90_mma_major_mode(), Float32, (2, 1, 1),
            tiler_mn=(64, self.bn))                                  # two warpgroups stacked along M
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
        tiles = cute.ceil_div(mC.shape[0], self.bm) * (mB.shape[0] // self.bn)
        self.kernel(tma_a, gA_tma, tma_b, gB_tma, mSA, mSG, mSU, mC, tiled_mma, sA_l, sB_l).launch(
            grid=[cutlass.min(tiles, self.sms), 1, 1], block=[THREADS_WS, 1, 1], min_blocks_per_mp=1,
            stream=stream)

    @cute.kernel
    def kernel(self, tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom, mB: cute.Tensor,
               mSA: cute.Tensor, mSG: cute.Tensor, mSU: cute.Tensor, mC: cute.Tensor, tiled_mma: cute.TiledMma,
               sA_l: cute.ComposedLayout, sB_l: cute.ComposedLayout):
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
            barrier_storage=storage.mbar.data_ptr(), num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, CONSUMER_WARPS),
            tx_count=tx_bytes, cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)))
        sA = storage.sA.get_tensor(sA_l.outer, swizzle=sA_l.inner)
        sB = storage.sB.get_tensor(sB_l.outer, swizzle=sB_l.inner)
        gA = cute.local_tile(mA, (self.bm, self.tile[2]), (None, None))      # (bm, bk, m tiles, k tiles)
        gB = cute.local_tile(mB, (self.bn, self.tile[2]), (None, None))
        m_tiles = cute.ceil_div(mC.shape[0], self.bm)
        n_tiles = mB.shape[0] // self.bn                 # B rows = 2 x outputs
        tiles = m_tiles * n_tiles
        k_tiles = cute.size(gA, mode=[3])
        if warp < 4:                                                       # producer warpgroup
            cute.arch.setmaxregister_decrease(PRODUCER_REGS)
            if warp == 0:
                tAsA, tAgA = cpasync.tma_partition(tma_a, 0, cute.make_layout(1),
                                                   cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2))
                tBsB, tBgB = cpasync.tma_partition(tma_b, 0, cute.make_layout(1),
                                                   cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2))
                prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
                t = cutlass.Int32(bid)
                while t < tiles:
                    mt, nt = _tile_coords(t, m_tiles, n_tiles)
                    for kt in cutlass.range(k_tiles, unroll=1):
                        pipe.producer_acquire(prod)
                        cute.copy(tma_a, tAgA[(None, mt, kt)], tAsA[(None, prod.index)],
                                  tma_bar_ptr=pipe.producer_get_barrier(prod))
                        cute.copy(tma_b, tBgB[(None, nt, kt)], tBsB[(None, prod.index)],
                                  tma_bar_ptr=pipe.producer_get_barrier(prod))
                        pipe.producer_commit(prod)
                        prod.advance()
                    t = t + nctas
                pipe.producer_tail(prod)
        else:                                                              # two consumer warpgroups
            cute.arch.setmaxregister_increase(CONSUMER_REGS)
            thr_mma = tiled_mma.get_slice(tidx - 128)
            tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
            tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
            cT = thr_mma.partition_C(cute.make_identity_tensor((self.bm, self.bn)))
            _check_fragment(cT)
            acc = cute.make_rmem_tensor(cT.shape, Float32)
            tmp = cute.make_rmem_tensor(cT.shape, Float32)
            r0 = cT[0][0]
            c0 = cT[0][1]
            rows = mC.shape[0]
            cons = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
            t = cutlass.Int32(bid)
            while t < tiles:
                mt, nt = _tile_coords(t, m_tiles, n_tiles)
                row0 = mt * self.bm + r0
                ra = cutlass.min(row0, rows - 1)
                rb = cutlass.min(row0 + 8, rows - 1)
                acc.fill(0.0)
                for kt in cutlass.range(k_tiles, unroll=1):
                    sg = mSG[kt, nt // 2]
                    su = mSU[kt, nt // 2]
                    sa0 = mSA[ra, kt]
                    sa1 = mSA[rb, kt]
                    pipe.consumer_wait(cons)
                    tiled_mma.set(warpgroup.Field.ACCUMULATE, False)
                    warpgroup.fence()
                    for kb in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
                        cute.gemm(tiled_mma, tmp, tCrA[None, None, kb, cons.index],
                                  tCrB[None, None, kb, cons.index], tmp)
                        tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
                    warpgroup.commit_group()
                    warpgroup.wait_group(0)
                    pipe.consumer_release(cons)
                    cons.advance()
                    sc = (sa0 * sg, sa1 * sg, sa0 * su, sa1 * su)     # (gate, up) x (row r0, row r0 + 8)
                    for i in cutlass.range_constexpr(cute.size(acc)):
                        acc[i] = acc[i] + tmp[i] * sc[(i // 32) * 2 + (i // 2) % 2]
                for h in cutlass.range_constexpr(2):                      # epilogue: silu(gate) * up
                    row = row0 + 8 * h
                    if row < rows:
                        crow = cute.zipped_divide(mC[row, None], (2,))
                        for c in cutlass.range_constexpr(cute.size(acc) // 8):
                            col = nt * HALF + c0 + 8 * c
                            rg = cute.make_rmem_tensor((2,), Float32)
                            ru = cute.make_rmem_tensor((2,), Float32)
                            for j in cutlass.range_constexpr(2):
                                rg[j] = acc[4 * c + 2 * h + j]
                                ru[j] = acc[4 * (c + 8) + 2 * h + j]
                            g = rg.load()
                            ro = cute.make_rmem_tensor((2,), mC.element_type)
                            ro.store((g / (1.0 + cute.math.exp(-g)) * ru.load()).to(mC.element_type))
                            cute.autovec_copy(ro, crow[None, col // 2])
                t = t + nctas


def _check_fragment(cT):
    """The promotion and the epilogue index the accumulator by position: element i = j + 2h + 4c of a thread's
    m64n128 fragment sits at tile row r0 + 8h, column c0 + 8c + j (checked while tracing), so columns c < 8
    are gate values and element i + 32 is the up value of the same output."""
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


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _prepare(qx, scale_x, qw_gate, scale_gate, qw_up, scale_up, arch=None):
    k, inter = qw_gate.shape
    n = 2 * inter
    assert qx.shape[1] == k and qw_up.shape == (k, inter), (qx.shape, qw_gate.shape, qw_up.shape)
    assert k % BLOCK == 0 and inter % BLOCK == 0, (k, inter)
    if (k, n) not in _COMPILED:
        opts = f"--gpu-arch {arch or _arch()} --enable-tvm-ffi"
        m = cute.sym_int()
        u8, bf = cutlass.Uint8, cutlass.BFloat16
        stream = make_fake_stream(use_tvm_ffi_env_stream=True)
        relayout = cute.compile(Relayout(),
                                make_fake_compact_tensor(u8, (k, inter), stride_order=(1, 0), assumed_align=16),
                                make_fake_compact_tensor(u8, (n - HALF, k), stride_order=(1, 0), assumed_align=16),
                                stream, options=opts)
        sms = H200_SMS if arch else torch.cuda.get_device_properties(0).multi_processor_count
        gemm = cute.compile(Fp8GemmWS(sms),
                            make_fake_compact_tensor(u8, (m, k), stride_order=(1, 0), assumed_align=16),
                            make_fake_compact_tensor(Float32, (m, k // BLOCK), stride_order=(1, 0)),
                            make_fake_compact_tensor(u8, (n, k), stride_order=(1, 0), assumed_align=16),
                            make_fake_compact_tensor(Float32, (k // BLOCK, inter // BLOCK), stride_order=(1, 0)),
                            make_fake_compact_tensor(Float32, (k // BLOCK, inter // BLOCK), stride_order=(1, 0)),
                            make_fake_compact_tensor(bf, (m, inter), stride_order=(1, 0), assumed_align=16),
                            stream, options=opts)
        _COMPILED[(k, n)] = (relayout, gemm)
    return list(_COMPILED[(k, n)])


def solve(qx, scale_x, qw_gate, scale_gate, qw_up, scale_up):
    relayout, gemm = _prepare(qx, scale_x, qw_gate, scale_gate, qw_up, scale_up)
    (tokens, k), inter, dev = qx.shape, qw_gate.shape[1], qx.device
    w = torch.empty(2 * inter, k, dtype=torch.uint8, device=dev)      # gate/up codes, N-major, 64-row interleave
    relayout(qw_gate.view(torch.uint8), w[:2 * inter - HALF])
    relayout(qw_up.view(torch.uint8), w[HALF:])
    out = torch.empty(tokens, inter, dtype=torch.bfloat16, device=dev)
    gemm(qx.view(torch.uint8), scale_x, w, scale_gate, scale_up, out)
    return out
