"""p53 FP8 block-scaled gate/up projections + SiLU gating (3584 -> 2 x 18944) in TIRx: one fused FP8 WGMMA kernel.

h = dequant(x) @ dequant(W).T, out = silu(h[:, :I]) * h[:, I:], x e4m3 (1x128 scales), W e4m3 (128x128).
A CTA owns 64 rows x 64 output columns: its B tile stacks the 64 gate rows n0.. and the 64 up rows
I+n0.. (two TMA boxes into one 128-row, 128B-swizzled smem tile), so one WGMMA m64n128k32 chain yields
the gate and up values of the same outputs in the same thread (fragment columns c and c+64).  Per
128-wide K block the raw tensor-core product is promoted into the fp32 accumulator with the block
scales (gate and up halves use their own weight-block scale).  Epilogue: silu(gate) * up in fp32, one
rounding to bf16.
The problem gives the gate and up weights K-major ([3584, 18944] each); eager torch stacks them
N-major into one [2 x 18944, 3584] weight (gate rows first) with matching block scales.
"""
import torch  # before tvm, so TVM's CUDA runtime finds the already-loaded CUDA libraries

import tvm
from tvm.backend.cuda.codegen.registry import CODEGEN_REGISTRY, register_codegen
from tvm.script import tirx as T


# apache-tvm 0.27.0.post1: the wgmma.noop_barrier codegen reads `reg.dtype`, which a buffer element
# lacks; re-register it to read the dtype from the type (the workaround verified on the H200).
@register_codegen("cuda_wgmma_noop_barrier")
def _noop_barrier(reg):
    d = getattr(reg, "dtype", None)
    dt = str(d) if d is not None else str(reg.ty.dtype)
    name = {"uint32": "tirx.cuda_wgmma_noop_barrier_uint32", "float32": "tirx.cuda_wgmma_noop_barrier_float32"}[dt]
    res = CODEGEN_REGISTRY[name]([reg])
    return res[0] if isinstance(res, tuple) else res


BLOCK = 128
BM, BN, BK = 64, 128, 128          # BK = one 128-byte swizzle row of fp8 = one scale block
NACC = BM * BN // 128
WGMMA = "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3"
TMA_LOAD = "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
SWIZZLE_128B = 3


HALF = 64                          # output columns per CTA (gate half + up half = BN)


@T.prim_func
def fp8_gemm_swiglu(a: T.handle, sa: T.handle, b: T.handle, sb: T.handle, c: T.handle):
    M = T.int32()
    N = T.int32()
    K = T.int32()
    KB = T.int32()
    NB = T.int32()
    I = T.int32()
    A = T.match_buffer(a, (M, K), "uint8", align=16)          # fp8 e4m3 bytes
    SA = T.match_buffer(sa, (M, KB), "float32")
    B = T.match_buffer(b, (N, K), "uint8", align=16)          # N = 2 * I (gate rows, then up rows)
    SB = T.match_buffer(sb, (NB, KB), "float32")
    C = T.match_buffer(c, (M, I), "bfloat16", align=16)
    A_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)
    T.call_packed("runtime.cuTensorMapEncodeTiled", A_map, "uint8", 2, A.data,
                  K, M, K, BK, BM, 1, 1, 0, SWIZZLE_128B, 0, 0)
    B_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)
    T.call_packed("runtime.cuTensorMapEncodeTiled", B_map, "uint8", 2, B.data,
                  K, N, K, BK, HALF, 1, 1, 0, SWIZZLE_128B, 0, 0)
    T.device_entry()
    bn, bm = T.cta_id([T.ceildiv(I, HALF), T.ceildiv(M, BM)])
    tx = T.thread_id([128])
    A_s = T.alloc_buffer((BM, BK), "uint8", scope="shared", align=1024)
    B_s = T.alloc_buffer((BN, BK), "uint8", scope="shared", align=1024)
    bar = T.shared_scalar("uint64")
    phase = T.alloc_local((1,), "int32")
    acc = T.alloc_buffer((NACC,), "float32", scope="local")
    tmp = T.alloc_buffer((NACC,), "float32", scope="local")
    scl = T.alloc_local((4,), "float32")      # (gate, up) x (row r0, row r0 + 8)
    descA = T.alloc_local((1,), "uint64")
    descB = T.alloc_local((1,), "uint64")
    r0: T.let = bm * BM + (tx % 32) // 4 + (tx // 32) * 16
    if tx == 0:
        T.ptx.mbarrier.init.shared.b64(T.address_of(bar), T.uint32(1))
    T.ptx.fence.proxy.async_.shared__cta()
    T.cuda.cta_sync()
    phase[0] = 0
    for i in T.unroll(NACC):
        acc[i] = T.float32(0)
    for kt in T.serial(T.ceildiv(K, BK)):
        if tx == 0:
            T.ptx[TMA_LOAD](A_s.data, T.address_of(A_map), kt * BK, bm * BM, T.address_of(bar))
            T.ptx[TMA_LOAD](B_s.data, T.address_of(B_map), kt * BK, bn * HALF, T.address_of(bar))
            T.ptx[TMA_LOAD](B_s.ptr_to([HALF, 0]), T.address_of(B_map), kt * BK, I + bn * HALF, T.address_of(bar))
            T.ptx.mbarrier.arrive.expect_tx.shared.b64(T.address_of(bar), T.uint32((BM + BN) * BK))
        sbg: T.float32 = SB[(bn * HALF) // BLOCK, kt]
        sbu: T.float32 = SB[(I + bn * HALF) // BLOCK, kt]
        sa0: T.float32 = SA[T.min(r0, M - 1), kt]
        sa1: T.float32 = SA[T.min(r0 + 8, M - 1), kt]
        scl[0] = sa0 * sbg
        scl[1] = sa1 * sbg
        scl[2] = sa0 * sbu
        scl[3] = sa1 * sbu
        for i in T.unroll(NACC):
            tmp[i] = T.float32(0)
        T.cuda.mbarrier_wait(T.address_of(bar), phase[0])
        phase[0] = phase[0] ^ 1
        for i in T.unroll(NACC):
            T.cuda.wgmma.noop_barrier(tmp[i])
        T.ptx.wgmma.fence.sync.aligned()
        for kk in T.unroll(BK // 32):      # 32 fp8 = 32 bytes per k32 step inside the swizzled row
            T.cuda.wgmma.encode_matrix_descriptor(T.address_of(descA[0]), A_s.ptr_to([0, kk * 32]), 1, 64, SWIZZLE_128B)
            T.cuda.wgmma.encode_matrix_descriptor(T.address_of(descB[0]), B_s.ptr_to([0, kk * 32]), 1, 64, SWIZZLE_128B)
            T.ptx[WGMMA](*[tmp[i] for i in range(NACC)], descA[0], descB[0], T.bool(True), 1, 1)
        T.ptx.wgmma.commit_group.sync.aligned()
        T.ptx.wgmma.wait_group.sync.aligned(0)
        for i in T.unroll(NACC):
            T.cuda.wgmma.noop_barrier(tmp[i])
        T.cuda.cta_sync()              # smem is reused by the next TMA load
        for i in T.unroll(NACC // 4):  # promote: fragment element (i, h, j) is row r0 + 8h, col 8i + 2(tx%4) + j
            for h in T.unroll(2):
                for j in T.unroll(2):
                    acc[i * 4 + h * 2 + j] = acc[i * 4 + h * 2 + j] + tmp[i * 4 + h * 2 + j] * scl[(i // 8) * 2 + h]
    for i in T.unroll(NACC // 8):      # fragment columns 8i.. are gate, 8(i+8).. the matching up values
        for h in T.unroll(2):
            for j in T.unroll(2):
                row = T.meta_var(r0 + h * 8)
                col = T.meta_var(bn * HALF + i * 8 + (tx % 4) * 2 + j)
                g = T.meta_var(acc[i * 4 + h * 2 + j])
                if row < M and col < I:
                    C[row, col] = T.Cast("bfloat16", g / (T.float32(1) + T.exp(-g)) * acc[(i + 8) * 4 + h * 2 + j])


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _build(func, arch):
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    with target:
        return tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")


def _prepare_fused(x, w_gate_up, arch=None):
    assert x.shape[1] % BK == 0 and (w_gate_up.shape[0] // 2) % HALF == 0
    if "gemm" not in _COMPILED:
        _COMPILED["gemm"] = _build(fp8_gemm_swiglu, arch or _arch())
    return [_COMPILED["gemm"]]


def _solve_fused(x, x_scale, w_gate_up, w_scale):
    (gemm,) = _prepare_fused(x, w_gate_up)
    inter = w_gate_up.shape[0] // 2
    out = torch.empty(x.shape[0], inter, dtype=torch.bfloat16, device=x.device)
    gemm(x.contiguous().view(torch.uint8), x_scale.to(torch.float32).contiguous(),
         w_gate_up.contiguous().view(torch.uint8), w_scale.to(torch.float32).contiguous(), out)
    return out


def _fused(qw_gate, scale_gate, qw_up, scale_up):
    """The problem's K-major gate and up weights ([K, I] each, 128x128 scales [K/128, I/128]) as one
    N-major [2I, K] weight (gate rows first) with [2I/128, K/128] scales: the layout the kernel reads."""
    w = torch.cat([qw_gate.view(torch.uint8).t(), qw_up.view(torch.uint8).t()]).contiguous()
    return w.view(torch.float8_e4m3fn), torch.cat([scale_gate.t(), scale_up.t()]).to(torch.float32).contiguous()


def solve(qx, scale_x, qw_gate, scale_gate, qw_up, scale_up):
    return _solve_fused(qx, scale_x, *_fused(qw_gate, scale_gate, qw_up, scale_up))


def _prepare(qx, scale_x, qw_gate, scale_gate, qw_up, scale_up, arch=None):
    return _prepare_fused(qx, torch.empty(2 * qw_gate.shape[1], qx.shape[1], device="meta"), arch=arch)
