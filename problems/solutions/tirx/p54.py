"""p54 Qwen3-VL FP8 block-scaled Q/K/V projections with biases and per-head q/k RMSNorm, in TIRx.

Kernel 1 (row_quant): x [T, 7680] to e4m3 per token per 128 channels: 16 lanes per block, 8 bf16 each
(one 16-byte load), butterfly absmax over the 16 lanes, scale = max(amax, 1e-12) / 448 and codes =
e4m3(clamp(x / scale)); every division is done in fp64 and rounded once to fp32, which equals the IEEE
fp32 division of the reference (NVRTC's fast math would make it approximate).
Kernel 2 (block_quant, three launches): W_q, W_k, W_v in 128x128 blocks (the blocks of W.T are those of
W transposed), written straight into one stacked [9728, 7680] code matrix and [76, 60] scales.
Kernel 3 (gemm, the p52 core): y = x @ [W_q; W_k; W_v].T + b in one GEMM: 64x128 tiles (N fastest),
TMA with 128-byte swizzle, four WGMMA m64n128k32 e4m3 per 128-wide K block into a scratch accumulator
promoted into fp32 with x_scale[row, kb] * w_scale[n-block, kb]; bias in fp32, one rounding to bf16.
Kernel 4 (head_norm): RMSNorm over each 128-wide q and k head in place (16 lanes per head row, 8 values
each, butterfly sum; normalised value rounded to bf16, times the bf16 weight, rounded to bf16).
q, k and v are head-major views [B, heads, S, 128] of y, as the reference's transposes.
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


def _make_gemm(with_bias: bool):
    """C = dequant(A) @ dequant(B).T [+ bias] (the p52 core)."""

    @T.prim_func
    def fp8_gemm_bias(a: T.handle, sa: T.handle, b: T.handle, sb: T.handle, bias: T.handle, c: T.handle):
        M = T.int32()
        N = T.int32()
        K = T.int32()
        KB = T.int32()
        NB = T.int32()
        A = T.match_buffer(a, (M, K), "uint8", align=16)          # fp8 e4m3 bytes
        SA = T.match_buffer(sa, (M, KB), "float32")
        B = T.match_buffer(b, (N, K), "uint8", align=16)
        SB = T.match_buffer(sb, (NB, KB), "float32")
        BIAS = T.match_buffer(bias, (N,), "bfloat16")
        C = T.match_buffer(c, (M, N), "bfloat16", align=16)
        A_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)
        T.call_packed("runtime.cuTensorMapEncodeTiled", A_map, "uint8", 2, A.data,
                      K, M, K, BK, BM, 1, 1, 0, SWIZZLE_128B, 0, 0)
        B_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)
        T.call_packed("runtime.cuTensorMapEncodeTiled", B_map, "uint8", 2, B.data,
                      K, N, K, BK, BN, 1, 1, 0, SWIZZLE_128B, 0, 0)
        T.device_entry()
        bn, bm = T.cta_id([T.ceildiv(N, BN), T.ceildiv(M, BM)])
        tx = T.thread_id([128])
        A_s = T.alloc_buffer((BM, BK), "uint8", scope="shared", align=1024)
        B_s = T.alloc_buffer((BN, BK), "uint8", scope="shared", align=1024)
        bar = T.shared_scalar("uint64")
        phase = T.alloc_local((1,), "int32")
        acc = T.alloc_buffer((NACC,), "float32", scope="local")
        tmp = T.alloc_buffer((NACC,), "float32", scope="local")
        scl = T.alloc_local((2,), "float32")
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
                T.ptx[TMA_LOAD](B_s.data, T.address_of(B_map), kt * BK, bn * BN, T.address_of(bar))
                T.ptx.mbarrier.arrive.expect_tx.shared.b64(T.address_of(bar), T.uint32((BM + BN) * BK))
            sbv: T.float32 = SB[(bn * BN) // BLOCK, kt]
            scl[0] = SA[T.min(r0, M - 1), kt] * sbv
            scl[1] = SA[T.min(r0 + 8, M - 1), kt] * sbv
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
                        acc[i * 4 + h * 2 + j] = acc[i * 4 + h * 2 + j] + tmp[i * 4 + h * 2 + j] * scl[h]
        for i in T.unroll(NACC // 4):
            for h in T.unroll(2):
                for j in T.unroll(2):
                    row = T.meta_var(r0 + h * 8)
                    col = T.meta_var(bn * BN + i * 8 + (tx % 4) * 2 + j)
                    if row < M and col < N:
                        if with_bias:
                            C[row, col] = T.Cast("bfloat16", acc[i * 4 + h * 2 + j] + T.Cast("float32", BIAS[col]))
                        else:
                            C[row, col] = T.Cast("bfloat16", acc[i * 4 + h * 2 + j])

    return fp8_gemm_bias


FP8_MAX = 448.0
MIN_AMAX = 1e-12
THREADS = 256
WARPS = THREADS // 32
HEAD_DIM = 128
FULL = T.uint32(0xFFFFFFFF)


def _div(a, b):
    """IEEE fp32 a / b under fast math: divide in fp64, round once."""
    return T.Cast("float32", T.Cast("float64", a) / T.Cast("float64", b))


def _code(v, scale):
    """e4m3(clamp(v / scale, -448, 448)), round to nearest even."""
    return T.Cast("float8_e4m3fn", T.min(T.max(_div(v, scale), T.float32(-FP8_MAX)), T.float32(FP8_MAX)))


def _absf(v):
    return T.max(v, -v)


def _make_row_quant(K: int):
    NV = K // 8

    @T.prim_func
    def row_quant(x_h: T.handle, c_h: T.handle, s_h: T.handle):
        rows = T.int32()
        X = T.match_buffer(x_h, (rows, K), "bfloat16", align=16)
        C = T.match_buffer(c_h, (rows, K), "uint8", align=16)
        S = T.match_buffer(s_h, (rows, K // BLOCK), "float32")
        T.device_entry()
        bx = T.cta_id([T.ceildiv(rows * NV, THREADS)])
        tx = T.thread_id([THREADS])
        C8 = T.decl_buffer((rows, K), "float8_e4m3fn", data=C.data)
        xr = T.alloc_local((8,), "bfloat16")
        qr = T.alloc_local((8,), "float8_e4m3fn")
        amax = T.alloc_local((1,), "float32")
        sc = T.alloc_local((1,), "float32")
        v = T.meta_var(T.min(bx * THREADS + tx, rows * NV - 1))    # whole 16-lane groups shuffle
        T.tile.copy(xr[:], X[v // NV, (v % NV) * 8:(v % NV) * 8 + 8])
        amax[0] = T.float32(0)
        for e in T.unroll(8):
            amax[0] = T.max(amax[0], _absf(T.Cast("float32", xr[e])))
        for k in T.unroll(4):
            amax[0] = T.max(amax[0], T.tvm_warp_shuffle_xor(FULL, amax[0], 8 >> k, 32, 32))
        sc[0] = _div(T.max(amax[0], T.float32(MIN_AMAX)), T.float32(FP8_MAX))
        for e in T.unroll(8):
            qr[e] = _code(T.Cast("float32", xr[e]), sc[0])
        if bx * THREADS + tx < rows * NV:
            T.tile.copy(C8[v // NV, (v % NV) * 8:(v % NV) * 8 + 8], qr[:])
            if v % 16 == 0:
                S[v // NV, (v % NV) // 16] = sc[0]

    return row_quant


@T.prim_func
def block_quant(w_h: T.handle, c_h: T.handle, s_h: T.handle):
    NB = T.int32()
    KB = T.int32()
    W = T.match_buffer(w_h, (NB * BLOCK, KB * BLOCK), "bfloat16", align=16)   # rows of whole 128-blocks:
    C = T.match_buffer(c_h, (NB * BLOCK, KB * BLOCK), "uint8", align=16)      # 16-byte row alignment seen
    S = T.match_buffer(s_h, (NB, KB), "float32")
    T.device_entry()
    kb, nb = T.cta_id([KB, NB])
    tx = T.thread_id([THREADS])
    C8 = T.decl_buffer((NB * BLOCK, KB * BLOCK), "float8_e4m3fn", data=C.data)
    red = T.alloc_shared((WARPS,), "float32")
    r = T.alloc_local((64,), "bfloat16")
    qr = T.alloc_local((8,), "float8_e4m3fn")
    amax = T.alloc_local((1,), "float32")
    amax[0] = T.float32(0)
    for i in T.unroll(8):                  # chunk j = i * 256 + tx: row j // 16, 8 columns at (j % 16) * 8
        T.tile.copy(r[i * 8:i * 8 + 8], W[nb * BLOCK + i * 16 + tx // 16,
                                          kb * BLOCK + (tx % 16) * 8:kb * BLOCK + (tx % 16) * 8 + 8])
        for e in T.unroll(8):
            amax[0] = T.max(amax[0], _absf(T.Cast("float32", r[i * 8 + e])))
    tot: T.float32 = T.cuda.cta_max(amax[0], WARPS, red.data)
    scale: T.float32 = _div(T.max(tot, T.float32(MIN_AMAX)), T.float32(FP8_MAX))
    if tx == 0:
        S[nb, kb] = scale
    for i in T.unroll(8):
        for e in T.unroll(8):
            qr[e] = _code(T.Cast("float32", r[i * 8 + e]), scale)
        T.tile.copy(C8[nb * BLOCK + i * 16 + tx // 16, kb * BLOCK + (tx % 16) * 8:kb * BLOCK + (tx % 16) * 8 + 8],
                    qr[:])


def _make_head_norm(N: int, HQ: int, HK: int, eps: float):
    NH = HQ + HK

    @T.prim_func
    def head_norm(y_h: T.handle, wq_h: T.handle, wk_h: T.handle):
        rows = T.int32()
        Y = T.match_buffer(y_h, (rows, N), "bfloat16", align=16)
        WQ = T.match_buffer(wq_h, (HEAD_DIM,), "bfloat16", align=16)
        WK = T.match_buffer(wk_h, (HEAD_DIM,), "bfloat16", align=16)
        T.device_entry()
        bx = T.cta_id([T.ceildiv(rows * NH * 16, THREADS)])
        tx = T.thread_id([THREADS])
        yr = T.alloc_local((8,), "bfloat16")
        wr = T.alloc_local((8,), "bfloat16")
        acc = T.alloc_local((1,), "float32")
        v = T.meta_var(T.min(bx * THREADS + tx, rows * NH * 16 - 1))   # whole 16-lane groups shuffle
        row = T.meta_var(v // (16 * NH))
        col = T.meta_var(((v // 16) % NH) * HEAD_DIM + (v % 16) * 8)
        T.tile.copy(yr[:], Y[row, col:col + 8])
        if (v // 16) % NH < HQ:
            T.tile.copy(wr[:], WQ[(v % 16) * 8:(v % 16) * 8 + 8])
        else:
            T.tile.copy(wr[:], WK[(v % 16) * 8:(v % 16) * 8 + 8])
        acc[0] = T.float32(0)
        for e in T.unroll(8):
            acc[0] = acc[0] + T.Cast("float32", yr[e]) * T.Cast("float32", yr[e])
        for k in T.unroll(4):
            acc[0] = acc[0] + T.tvm_warp_shuffle_xor(FULL, acc[0], 8 >> k, 32, 32)
        rstd: T.float32 = T.rsqrt(acc[0] * T.float32(1.0 / HEAD_DIM) + T.float32(eps))
        for e in T.unroll(8):
            yr[e] = T.Cast("bfloat16", T.Cast("float32", wr[e]) * T.Cast(
                "float32", T.Cast("bfloat16", T.Cast("float32", yr[e]) * rstd)))
        if bx * THREADS + tx < rows * NH * 16:
            T.tile.copy(Y[row, col:col + 8], yr[:])

    return head_norm


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _build(func, arch):
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    with target:
        return tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")


def _prepare(x, q_weight, k_weight, v_weight, q_bias, k_bias, v_bias, q_norm_weight, k_norm_weight, eps, arch=None):
    hidden = x.shape[-1]
    n = q_weight.shape[0] + k_weight.shape[0] + v_weight.shape[0]
    hq, hk = q_weight.shape[0] // HEAD_DIM, k_weight.shape[0] // HEAD_DIM
    key = (hidden, n, hq, hk, float(eps))
    assert hidden % BLOCK == 0 and all(w.shape[0] % BLOCK == 0 for w in (q_weight, k_weight, v_weight)), key
    if key not in _COMPILED:
        arch = arch or _arch()
        _COMPILED[key] = tuple(_build(f, arch) for f in (_make_row_quant(hidden), block_quant, _make_gemm(True),
                                                         _make_head_norm(n, hq, hk, float(eps))))
    return list(_COMPILED[key])


def solve(x, q_weight, k_weight, v_weight, q_bias, k_bias, v_bias, q_norm_weight, k_norm_weight, eps):
    row_quant, block_quant_exe, gemm, head_norm = _prepare(x, q_weight, k_weight, v_weight, q_bias, k_bias,
                                                           v_bias, q_norm_weight, k_norm_weight, eps)
    b, s, hidden = x.shape
    t, dev = b * s, x.device
    weights = (q_weight, k_weight, v_weight)
    n = sum(w.shape[0] for w in weights)
    xq = torch.empty(t, hidden, dtype=torch.uint8, device=dev)
    xs = torch.empty(t, hidden // BLOCK, dtype=torch.float32, device=dev)
    row_quant(x.contiguous().view(t, hidden), xq, xs)
    wq = torch.empty(n, hidden, dtype=torch.uint8, device=dev)       # [W_q; W_k; W_v] codes, stacked in place
    ws = torch.empty(n // BLOCK, hidden // BLOCK, dtype=torch.float32, device=dev)
    start = 0
    for w in weights:
        rows = w.shape[0]
        block_quant_exe(w.contiguous(), wq[start:start + rows], ws[start // BLOCK:(start + rows) // BLOCK])
        start += rows
    y = torch.empty(t, n, dtype=x.dtype, device=dev)
    gemm(xq, xs, wq, ws, torch.cat([q_bias, k_bias, v_bias]), y)
    head_norm(y, q_norm_weight.contiguous(), k_norm_weight.contiguous())
    heads = y.view(b, s, n // HEAD_DIM, HEAD_DIM).transpose(1, 2)
    hq, hk = q_weight.shape[0] // HEAD_DIM, k_weight.shape[0] // HEAD_DIM
    return heads[:, :hq], heads[:, hq:hq + hk], heads[:, hq + hk:]
