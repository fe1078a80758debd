"""C = A @ B^T on Hopper tensor cores: TMA loads, an mbarrier and wgmma, at the PTX level (guide chapters 05-06).

A: (M, K) bf16 and B: (N, K) bf16, both K-major (row-major, K contiguous); C: (M, N) bf16, fp32
accumulation. One warpgroup (128 threads) computes a 64x128 tile of C. Per 64-wide K step, thread 0
issues two TMA tile loads into 128B-swizzled shared memory and arms an mbarrier with the byte count;
everyone waits on it, then four m64n128k16 wgmma instructions read both operands from shared memory
through matrix descriptors. sm_90a only; K % 8 == 0 (TMA strides are multiples of 16 bytes).
Deliberately simple: a single stage (the load of step k+1 waits for the MMAs of step k), no warp
specialization, a direct register-to-global epilogue (see the guide for what a fast GEMM adds).
"""

import torch

from tirx_util import T, compile_tirx, main, patch_wgmma_noop_barrier

BM, BN, BK = 64, 128, 64  # 64 bf16 = one 128-byte swizzle row
NACC = BM * BN // 128  # fp32 accumulator registers per thread
WGMMA = "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16"
TMA_LOAD = "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
SWIZZLE_128B = 3  # CUtensorMapSwizzle value, and the descriptor's swizzle mode


@T.prim_func
def gemm(a: T.handle, b: T.handle, c: T.handle):
    M = T.int32()
    N = T.int32()
    K = T.int32()
    A = T.match_buffer(a, (M, K), "bfloat16", align=16)
    B = T.match_buffer(b, (N, K), "bfloat16", align=16)
    C = T.match_buffer(c, (M, N), "bfloat16", align=16)
    # host side, before device_entry: TMA descriptors. Arguments after the pointer: sizes (innermost
    # first), outer stride in bytes, box size, element strides, interleave, swizzle, L2 promotion, OOB fill
    A_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)
    T.call_packed("runtime.cuTensorMapEncodeTiled", A_map, "bfloat16", 2, A.data,
                  K, M, K * 2, BK, BM, 1, 1, 0, SWIZZLE_128B, 0, 0)
    B_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)
    T.call_packed("runtime.cuTensorMapEncodeTiled", B_map, "bfloat16", 2, B.data,
                  K, N, K * 2, BK, BN, 1, 1, 0, SWIZZLE_128B, 0, 0)

    T.device_entry()
    bn, bm = T.cta_id([T.ceildiv(N, BN), T.ceildiv(M, BM)])
    tx = T.thread_id([128])
    A_s = T.alloc_buffer((BM, BK), "bfloat16", scope="shared", align=1024)  # swizzle needs 1024 B
    B_s = T.alloc_buffer((BN, BK), "bfloat16", scope="shared", align=1024)
    bar = T.shared_scalar("uint64")
    phase = T.alloc_local((1,), "int32")
    acc = T.alloc_buffer((NACC,), "float32", scope="local")
    desc_a = T.alloc_local((1,), "uint64")
    desc_b = T.alloc_local((1,), "uint64")
    if tx == 0:
        T.ptx.mbarrier.init.shared.b64(T.address_of(bar), T.uint32(1))
    T.ptx.fence.proxy.async_.shared__cta()  # make the init visible to the async (TMA) proxy
    T.cuda.cta_sync()
    phase[0] = 0
    for i in T.unroll(NACC):
        acc[i] = T.float32(0)
    for kt in T.serial(T.ceildiv(K, BK)):
        if tx == 0:  # one thread issues both loads; the barrier completes when all bytes arrived
            T.ptx[TMA_LOAD](A_s.data, T.address_of(A_map), kt * BK, bm * BM, T.address_of(bar))
            T.ptx[TMA_LOAD](B_s.data, T.address_of(B_map), kt * BK, bn * BN, T.address_of(bar))
            T.ptx.mbarrier.arrive.expect_tx.shared.b64(T.address_of(bar), T.uint32((BM + BN) * BK * 2))
        T.cuda.mbarrier_wait(T.address_of(bar), phase[0])
        phase[0] = phase[0] ^ 1
        for i in T.unroll(NACC):
            T.cuda.wgmma.noop_barrier(acc[i])  # keep the compiler from moving accumulator accesses
        T.ptx.wgmma.fence.sync.aligned()
        for kk in T.unroll(BK // 16):  # k16 steps: 32 bytes further into each swizzled row
            T.cuda.wgmma.encode_matrix_descriptor(T.address_of(desc_a[0]), A_s.ptr_to([0, kk * 16]), 1, 64,
                                                  SWIZZLE_128B)
            T.cuda.wgmma.encode_matrix_descriptor(T.address_of(desc_b[0]), B_s.ptr_to([0, kk * 16]), 1, 64,
                                                  SWIZZLE_128B)
            T.ptx[WGMMA](*[acc[i] for i in range(NACC)], desc_a[0], desc_b[0], T.bool(True), 1, 1, 0, 0)
        T.ptx.wgmma.commit_group.sync.aligned()
        T.ptx.wgmma.wait_group.sync.aligned(0)
        for i in T.unroll(NACC):
            T.cuda.wgmma.noop_barrier(acc[i])
        T.cuda.cta_sync()  # the next TMA load overwrites A_s/B_s
    # epilogue from the documented m64nN accumulator fragment: thread t holds rows
    # (t % 32) // 4 + 16 * (t // 32) (+8) and column pairs 8 * i + 2 * (t % 4) (+1)
    for i in T.unroll(NACC // 4):
        for h in T.unroll(2):
            for j in T.unroll(2):
                row = T.meta_var(bm * BM + (tx % 32) // 4 + (tx // 32) * 16 + h * 8)
                col = T.meta_var(bn * BN + i * 8 + (tx % 4) * 2 + j)
                if row < M and col < N:
                    C[row, col] = T.Cast("bfloat16", acc[i * 4 + h * 2 + j])


def build(arch: str = "sm_90a"):
    patch_wgmma_noop_barrier()
    return compile_tirx(gemm, arch)


def check(fn):
    for m, n, k in ((64, 128, 64), (1000, 1032, 520), (4096, 4096, 4096)):
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
