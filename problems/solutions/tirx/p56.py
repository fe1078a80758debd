"""p56 DeepSeek-V3.1 MLA KV path with FP8 quantization inside and a mid-chain requantization, in TIRx.

Kernel 1 (row_quant): x [T, 7168] to e4m3 per token per 128 channels: 16 lanes per block, 8 bf16 each
(one 16-byte load), butterfly absmax over the 16 lanes, scale = max(amax, 1e-12) / 448 and codes =
e4m3(clamp(x / scale)); every division is done in fp64 and rounded once to fp32, which equals the IEEE
fp32 division of the reference (NVRTC's fast math would make it approximate).
Kernel 2 (block_quant): each weight [N, K] in 128x128 blocks (the blocks of W.T are those of W
transposed): one CTA per block, 64 elements per thread in registers, CTA absmax, codes x / scale.
Kernel 3 (gemm, the p52 core): 64x128 tiles (N fastest), TMA with 128-byte swizzle, four WGMMA
m64n128k32 e4m3 per 128-wide K block into a scratch accumulator promoted into fp32 with
x_scale[row, kb] * w_scale[n-block, kb]; kv = x @ W_a.T rounded to bf16 [T, 640].
Kernel 4 (norm_quant): a warp per token: RMSNorm of kv[:, :512] (fp32 statistics, normalised value
rounded to bf16, times the bf16 weight, rounded to bf16), requantized in 1x128 blocks (8 lanes per
block) straight from registers.
Kernel 5: the gemm again, c @ W_b.T rounded to bf16 [T, 32768]; k_nope and v are its two views.
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
LORA = 512
NOPE = 128                                   # k_nope and v head dims
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


def _make_norm_quant(KV: int, eps: float):
    @T.prim_func
    def norm_quant(kv_h: T.handle, w_h: T.handle, c_h: T.handle, s_h: T.handle):
        rows = T.int32()
        KVB = T.match_buffer(kv_h, (rows, KV), "bfloat16", align=16)
        W = T.match_buffer(w_h, (LORA,), "bfloat16", align=16)
        C = T.match_buffer(c_h, (rows, LORA), "uint8", align=16)
        S = T.match_buffer(s_h, (rows, LORA // BLOCK), "float32")
        T.device_entry()
        bx = T.cta_id([T.ceildiv(rows, WARPS)])
        tx = T.thread_id([THREADS])
        C8 = T.decl_buffer((rows, LORA), "float8_e4m3fn", data=C.data)
        xr = T.alloc_local((16,), "bfloat16")
        wr = T.alloc_local((16,), "bfloat16")
        cr = T.alloc_local((16,), "float32")
        qr = T.alloc_local((16,), "float8_e4m3fn")
        acc = T.alloc_local((1,), "float32")
        lane = T.meta_var(tx % 32)
        row = T.meta_var(T.min(bx * WARPS + tx // 32, rows - 1))     # whole warps shuffle
        T.tile.copy(xr[:], KVB[row, lane * 16:lane * 16 + 16])
        T.tile.copy(wr[:], W[lane * 16:lane * 16 + 16])
        acc[0] = T.float32(0)
        for e in T.unroll(16):
            acc[0] = acc[0] + T.Cast("float32", xr[e]) * T.Cast("float32", xr[e])
        for k in T.unroll(5):
            acc[0] = acc[0] + T.tvm_warp_shuffle_xor(FULL, acc[0], 16 >> k, 32, 32)
        rstd: T.float32 = T.rsqrt(acc[0] * T.float32(1.0 / LORA) + T.float32(eps))
        for e in T.unroll(16):
            cr[e] = T.Cast("float32", T.Cast("bfloat16", T.Cast("float32", wr[e]) * T.Cast(
                "float32", T.Cast("bfloat16", T.Cast("float32", xr[e]) * rstd))))
        acc[0] = T.float32(0)
        for e in T.unroll(16):
            acc[0] = T.max(acc[0], _absf(cr[e]))
        for k in T.unroll(3):                                          # 8 lanes x 16 = one 128-wide block
            acc[0] = T.max(acc[0], T.tvm_warp_shuffle_xor(FULL, acc[0], 4 >> k, 32, 32))
        scale: T.float32 = _div(T.max(acc[0], T.float32(MIN_AMAX)), T.float32(FP8_MAX))
        for e in T.unroll(16):
            qr[e] = _code(cr[e], scale)
        if bx * WARPS + tx // 32 < rows:
            T.tile.copy(C8[row, lane * 16:lane * 16 + 16], qr[:])
            if lane % 8 == 0:
                S[row, lane // 8] = scale

    return norm_quant


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _build(func, arch):
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    with target:
        return tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")


def _prepare(x, w_a, norm_w, w_b, eps, arch=None):
    hidden, kv_n, out_n = x.shape[-1], w_a.shape[0], w_b.shape[0]
    key = (hidden, kv_n, float(eps))
    assert hidden % BLOCK == 0 and kv_n % BLOCK == 0 and out_n % BLOCK == 0 and kv_n >= LORA, key
    assert w_b.shape[1] == LORA and norm_w.shape[0] == LORA, (w_b.shape, norm_w.shape)
    if key not in _COMPILED:
        arch = arch or _arch()
        _COMPILED[key] = tuple(_build(f, arch) for f in (_make_row_quant(hidden), block_quant,
                                                         _make_norm_quant(kv_n, float(eps)), _make_gemm(False)))
    return list(_COMPILED[key])


def _weight_codes(block_quant_exe, w):
    n, k = w.shape
    codes = torch.empty(n, k, dtype=torch.uint8, device=w.device)
    scales = torch.empty(n // BLOCK, k // BLOCK, dtype=torch.float32, device=w.device)
    block_quant_exe(w.contiguous(), codes, scales)
    return codes, scales


def solve(x, w_a, norm_w, w_b, eps):
    row_quant, block_quant_exe, norm_quant, gemm = _prepare(x, w_a, norm_w, w_b, eps)
    b, s, hidden = x.shape
    t, dev, bf = b * s, x.device, torch.bfloat16
    xq = torch.empty(t, hidden, dtype=torch.uint8, device=dev)
    xs = torch.empty(t, hidden // BLOCK, dtype=torch.float32, device=dev)
    row_quant(x.contiguous().view(t, hidden), xq, xs)
    wa_q, wa_s = _weight_codes(block_quant_exe, w_a)
    wb_q, wb_s = _weight_codes(block_quant_exe, w_b)
    unused_bias = torch.empty(max(w_a.shape[0], w_b.shape[0]), dtype=bf, device=dev)   # no-bias epilogue
    kv = torch.empty(t, w_a.shape[0], dtype=bf, device=dev)
    gemm(xq, xs, wa_q, wa_s, unused_bias[:w_a.shape[0]], kv)
    cq = torch.empty(t, LORA, dtype=torch.uint8, device=dev)
    cs = torch.empty(t, LORA // BLOCK, dtype=torch.float32, device=dev)
    norm_quant(kv, norm_w.contiguous(), cq, cs)
    out = torch.empty(t, w_b.shape[0], dtype=bf, device=dev)
    gemm(cq, cs, wb_q, wb_s, unused_bias[:w_b.shape[0]], out)
    kvb = out.view(b, s, -1, 2 * NOPE)
    return kvb[..., :NOPE], kvb[..., NOPE:]
