"""p45 capacity-factor MoE dispatch (given top-8 routing, C = ceil(1.25 T 8 / E), overflow dropped) + batched SwiGLU experts in TIRx.

1. Dispatch, a CTA per expert (no atomics, deterministic): its assignments in flat (token, choice)
   order -- the reference's stable sort by expert -- get ranks 0, 1, ..; rank < C is kept at row
   e * S + rank of a gathered buffer (S = C rounded up to the 64-row GEMM tile), rank >= C is dropped
   (row -1).  Rows past the kept ones are marked empty and row tiles holding no kept row are skipped
   (tile -> expert map, -1): the zero padding of the reference's [E, C, H] buffer is never computed.
   Then a gather of the token rows.
2. Grouped GEMMs (TMA, 128B swizzle, WGMMA m64n128k16 with a transposed B, 64-row tiles) reading the
   [E, H, I] and [E, I, H] weights N-major in place through 3-D (N, K, E) tensor maps, two 64-column
   boxes per B tile: act = silu(x W_g) * (x W_u) (box 0 = 64 gate columns, box 1 = the same 64 up
   columns, so one WGMMA gives gate and up of the same outputs: SwiGLU in the epilogue in fp32, one
   bf16 rounding), then y = act W_d (bf16).
3. Combine, a CTA per token: out = sum over kept choices of w_j y_j, in fp32, rounded to bf16 once.
"""
import math

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


TOP_K = 8
CAPACITY_FACTOR = 1.25
BM, BK = 64, 64          # GEMM m-tile; each expert's segment of the gathered rows is C rounded up to it
NACC = BM * 128 // 128
VEC = 8
WGMMA = "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16"
TMA_2D = "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
TMA_3D = "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
SWIZZLE_128B = 3


def _make_gemm(swiglu: bool):
    """C (R, N) = A (R, K) @ B[e] (K, N), e = TILES[row block] (CTA skipped when -1), B read N-major in
    place; with swiglu C = silu(A B[e]) * (A B2[e]), 64 output columns a CTA."""
    BNO = 64 if swiglu else 128              # output columns per CTA

    @T.prim_func
    def gemm(a: T.handle, b: T.handle, b2: T.handle, tl: T.handle, c: T.handle):
        R = T.int32()
        N = T.int32()
        K = T.int32()
        G = T.int32()
        NT = T.int32()
        A = T.match_buffer(a, (R, K), "bfloat16", align=16)
        B = T.match_buffer(b, (G, K, N), "bfloat16", align=16)
        B2 = T.match_buffer(b2, (G, K, N), "bfloat16", align=16)
        TILES = T.match_buffer(tl, (NT,), "int32")
        C = T.match_buffer(c, (R, N), "bfloat16", align=16)
        A_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)
        T.call_packed("runtime.cuTensorMapEncodeTiled", A_map, "bfloat16", 2, A.data,
                      K, R, K * 2, BK, BM, 1, 1, 0, SWIZZLE_128B, 0, 0)
        B_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)
        T.call_packed("runtime.cuTensorMapEncodeTiled", B_map, "bfloat16", 3, B.data,   # (N, K, E), N innermost
                      N, K, G, N * 2, K * N * 2, 64, BK, 1, 1, 1, 1, 0, SWIZZLE_128B, 0, 0)
        B2_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)
        T.call_packed("runtime.cuTensorMapEncodeTiled", B2_map, "bfloat16", 3, B2.data,
                      N, K, G, N * 2, K * N * 2, 64, BK, 1, 1, 1, 1, 0, SWIZZLE_128B, 0, 0)
        T.device_entry()
        bn, bm = T.cta_id([T.ceildiv(N, BNO), T.ceildiv(R, BM)])
        tx = T.thread_id([128])
        A_s = T.alloc_buffer((BM, BK), "bfloat16", scope="shared", align=1024)
        B_s = T.alloc_buffer((2, BK, 64), "bfloat16", scope="shared", align=1024)   # two 64-column chunks
        bar = T.shared_scalar("uint64")
        phase = T.alloc_local((1,), "int32")
        acc = T.alloc_buffer((NACC,), "float32", scope="local")
        descA = T.alloc_local((1,), "uint64")
        descB = T.alloc_local((1,), "uint64")
        e: T.int32 = TILES[bm]
        if e >= 0:
            if tx == 0:
                T.ptx.mbarrier.init.shared.b64(T.address_of(bar), T.uint32(1))
            T.ptx.fence.proxy.async_.shared__cta()
            T.cuda.cta_sync()
            phase[0] = 0
            for i in T.unroll(NACC):
                acc[i] = T.float32(0)
            for kt in T.serial(T.ceildiv(K, BK)):
                if tx == 0:
                    T.ptx[TMA_2D](A_s.data, T.address_of(A_map), kt * BK, bm * BM, T.address_of(bar))
                    T.ptx[TMA_3D](B_s.data, T.address_of(B_map), bn * BNO, kt * BK, e, T.address_of(bar))
                    if swiglu:     # chunk 1: the up columns matching chunk 0's gate columns
                        T.ptx[TMA_3D](B_s.ptr_to([1, 0, 0]), T.address_of(B2_map), bn * BNO, kt * BK, e,
                                      T.address_of(bar))
                    else:
                        T.ptx[TMA_3D](B_s.ptr_to([1, 0, 0]), T.address_of(B_map), bn * BNO + 64, kt * BK, e,
                                      T.address_of(bar))
                    T.ptx.mbarrier.arrive.expect_tx.shared.b64(T.address_of(bar), T.uint32((BM + 128) * BK * 2))
                T.cuda.mbarrier_wait(T.address_of(bar), phase[0])
                phase[0] = phase[0] ^ 1
                for i in T.unroll(NACC):
                    T.cuda.wgmma.noop_barrier(acc[i])
                T.ptx.wgmma.fence.sync.aligned()
                for kk in T.unroll(BK // 16):
                    T.cuda.wgmma.encode_matrix_descriptor(T.address_of(descA[0]), A_s.ptr_to([0, kk * 16]), 1, 64,
                                                          SWIZZLE_128B)
                    # N-major B: LBO = the next 64-column chunk (BK rows of 128 B), SBO = the next 8 K rows
                    T.cuda.wgmma.encode_matrix_descriptor(T.address_of(descB[0]), B_s.ptr_to([0, kk * 16, 0]),
                                                          BK * 8, 64, SWIZZLE_128B)
                    T.ptx[WGMMA](*[acc[i] for i in range(NACC)], descA[0], descB[0], T.bool(True), 1, 1, 0, 1)
                T.ptx.wgmma.commit_group.sync.aligned()
                T.ptx.wgmma.wait_group.sync.aligned(0)
                for i in T.unroll(NACC):
                    T.cuda.wgmma.noop_barrier(acc[i])
                T.cuda.cta_sync()          # smem is reused by the next TMA load
            for i in T.unroll(NACC // 4 // (2 if swiglu else 1)):
                for h in T.unroll(2):
                    for j in T.unroll(2):
                        row = T.meta_var(bm * BM + (tx % 32) // 4 + (tx // 32) * 16 + h * 8)
                        col = T.meta_var(bn * BNO + i * 8 + (tx % 4) * 2 + j)
                        v = T.meta_var(acc[i * 4 + h * 2 + j])
                        if row < R and col < N:
                            if swiglu:     # fragment columns 8i.. are gate, 8(i+8).. the matching up values
                                C[row, col] = T.Cast("bfloat16", v / (T.float32(1) + T.exp(-v))
                                                     * acc[(i + 8) * 4 + h * 2 + j])
                            else:
                                C[row, col] = T.Cast("bfloat16", v)

    return gemm


def _make_dispatch(E: int, CAP: int, SEG: int):
    """A CTA per expert e.  Its assignments, in flat (token, choice) order, get ranks 0, 1, ..; rank < CAP
    goes to row e * SEG + rank (ROW, and TOK = its token), rank >= CAP is dropped (ROW = -1).  TOK = -1
    on the segment's other rows; TILES[row block] = e while the block holds a kept row, else -1."""

    @T.prim_func
    def dispatch(i_h: T.handle, r_h: T.handle, t_h: T.handle, tl_h: T.handle):
        n = T.int32()
        R = T.int32()
        NT = T.int32()
        IDS = T.match_buffer(i_h, (n,), "int64")
        ROW = T.match_buffer(r_h, (n,), "int32")
        TOK = T.match_buffer(t_h, (R,), "int32")
        TILES = T.match_buffer(tl_h, (NT,), "int32")
        T.device_entry()
        e = T.cta_id([E])
        tx = T.thread_id([256])
        sm = T.alloc_shared((257,), "int32")
        cnt = T.alloc_local((1,), "int32")
        run = T.alloc_local((2,), "int32")
        chunk: T.let = T.ceildiv(n, 256)
        lo: T.let = T.min(tx * chunk, n)
        hi: T.let = T.min(lo + chunk, n)
        cnt[0] = 0
        for i in T.serial(hi - lo):
            if IDS[lo + i] == T.Cast("int64", e):
                cnt[0] = cnt[0] + 1
        sm[tx] = cnt[0]
        T.cuda.cta_sync()
        if tx == 0:                                  # exclusive scan of the 256 counts
            run[0] = 0
            for j in T.serial(256):
                run[1] = sm[j]
                sm[j] = run[0]
                run[0] = run[0] + run[1]
            sm[256] = run[0]
        T.cuda.cta_sync()
        kept: T.int32 = T.min(sm[256], CAP)
        cnt[0] = sm[tx]
        for i in T.serial(hi - lo):
            if IDS[lo + i] == T.Cast("int64", e):
                if cnt[0] < CAP:
                    ROW[lo + i] = e * SEG + cnt[0]
                    TOK[e * SEG + cnt[0]] = (lo + i) // TOP_K
                else:
                    ROW[lo + i] = -1
                cnt[0] = cnt[0] + 1
        for j in T.serial(T.ceildiv(SEG - kept - tx, 256)):
            TOK[e * SEG + kept + tx + j * 256] = -1
        for j in T.serial(T.ceildiv(SEG // BM - tx, 256)):
            b = T.meta_var(tx + j * 256)
            TILES[e * (SEG // BM) + b] = T.if_then_else(b * BM < kept, e, -1)

    return dispatch


def _make_gather(D: int):
    NV = D // VEC

    @T.prim_func
    def gather(x_h: T.handle, t_h: T.handle, g_h: T.handle):
        ntok = T.int32()
        R = T.int32()
        X = T.match_buffer(x_h, (ntok, D), "bfloat16", align=16)
        TOK = T.match_buffer(t_h, (R,), "int32")
        XG = T.match_buffer(g_h, (R, D), "bfloat16", align=16)
        T.device_entry()
        row = T.cta_id([R])
        tx = T.thread_id([128])
        r = T.alloc_local((VEC,), "bfloat16")
        tok: T.int32 = TOK[row]
        if tok >= 0:
            for it in T.serial(T.ceildiv(NV - tx, 128)):
                v = T.meta_var(tx + it * 128)
                T.tile.copy(r[:], X[tok, v * VEC:v * VEC + VEC])
                T.tile.copy(XG[row, v * VEC:v * VEC + VEC], r[:])

    return gather


def _make_combine(D: int):
    NV = D // VEC

    @T.prim_func
    def combine(y_h: T.handle, r_h: T.handle, w_h: T.handle, o_h: T.handle):
        ntok = T.int32()
        R = T.int32()
        n = T.int32()
        Y = T.match_buffer(y_h, (R, D), "bfloat16", align=16)
        ROW = T.match_buffer(r_h, (n,), "int32")
        W = T.match_buffer(w_h, (ntok, TOP_K), "bfloat16")
        O = T.match_buffer(o_h, (ntok, D), "bfloat16", align=16)
        T.device_entry()
        t = T.cta_id([ntok])
        tx = T.thread_id([128])
        r = T.alloc_local((VEC,), "bfloat16")
        o = T.alloc_local((VEC,), "bfloat16")
        acc = T.alloc_local((VEC,), "float32")
        for it in T.serial(T.ceildiv(NV - tx, 128)):
            v = T.meta_var(tx + it * 128)
            for i in T.unroll(VEC):
                acc[i] = T.float32(0)
            for j in T.unroll(TOP_K):
                if ROW[t * TOP_K + j] >= 0:          # a dropped choice adds nothing
                    T.tile.copy(r[:], Y[ROW[t * TOP_K + j], v * VEC:v * VEC + VEC])
                    for i in T.unroll(VEC):
                        acc[i] = acc[i] + T.Cast("float32", W[t, j]) * T.Cast("float32", r[i])
            for i in T.unroll(VEC):
                o[i] = T.Cast("bfloat16", acc[i])
            T.tile.copy(O[t, v * VEC:v * VEC + VEC], o[:])

    return combine


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _build(func, arch):
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    with target:
        return tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")


def _capacity(t, e):
    cap = math.ceil(CAPACITY_FACTOR * t * TOP_K / e)
    return cap, -(-cap // BM) * BM


def _prepare(x, selected, weights, w_gate, w_up, w_down, arch=None):
    (t, d), e = x.shape, w_gate.shape[0]
    assert d % VEC == 0 and selected.shape[1] == TOP_K, (d, selected.shape)
    cap, seg = _capacity(t, e)
    key = (d, e, cap)
    if key not in _COMPILED:
        a = arch or _arch()
        _COMPILED[key] = tuple(_build(fn, a) for fn in (
            _make_dispatch(e, cap, seg), _make_gather(d), _make_gemm(True), _make_gemm(False), _make_combine(d)))
    return list(_COMPILED[key])


def solve(x, selected, weights, w_gate, w_up, w_down):
    dispatch, gather, gemm_gu, gemm_d, combine = _prepare(x, selected, weights, w_gate, w_up, w_down)
    (t, d), (e, _, f) = x.shape, w_gate.shape
    _, seg = _capacity(t, e)
    rows = e * seg
    dev, bf = x.device, torch.bfloat16
    row_of = torch.empty(t * TOP_K, dtype=torch.int32, device=dev)
    tok_of = torch.empty(rows, dtype=torch.int32, device=dev)
    tiles = torch.empty(rows // BM, dtype=torch.int32, device=dev)
    xg = torch.empty(rows, d, dtype=bf, device=dev)
    act = torch.empty(rows, f, dtype=bf, device=dev)
    y = torch.empty(rows, d, dtype=bf, device=dev)
    out = torch.empty(t, d, dtype=bf, device=dev)
    dispatch(selected.contiguous().view(-1), row_of, tok_of, tiles)
    gather(x.contiguous(), tok_of, xg)
    gemm_gu(xg, w_gate.contiguous(), w_up.contiguous(), tiles, act)
    gemm_d(act, w_down.contiguous(), w_down.contiguous(), tiles, y)
    combine(y, row_of, weights.contiguous(), out)
    return out
