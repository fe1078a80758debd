"""p51 gpt-oss sparse experts from given top-4 routing (fp32 throughout) in TIRx.

fp32 in, fp32 weights, fp32 out against a fp32 cuBLAS reference: TF32 or bf16 tensor cores would round
the operands, so both expert GEMMs are CUDA-core FFMA GEMMs.
1. Dispatch, a CTA per expert (no atomics, deterministic): count its assignments (router_indices read
   as int64 in place), then its row offset in a gathered buffer whose expert segments are padded to the
   128-row GEMM tile, the row of each of its assignments in token order, the token of each row (-1 on
   padding) and the expert of each row tile (-1 past the last segment).
2. GEMM 1, a CTA per (128-column, 128-row) tile of one expert: A rows are gathered from x while the tile
   is staged (no gathered copy of x), B = gate_up[e] [2880, 5760] read in place; 256 threads, an 8 x 8
   register tile each, BK 16 with the next k-tile prefetched into registers.  Epilogue: + bias, the
   interleaved gate (even) / up (odd) columns of a thread pair up in its registers: clamped GLU
   (up + 1) * gate * sigmoid(1.702 gate) (the sigmoid in fp64: exact under NVRTC's fast math) -> h.
3. GEMM 2, same kernel: y = h @ down[e] + bias, times routing_weights[token, e] (the reference's
   two fp32 roundings) -> yw [rows, 2880].
4. Combine, a CTA per token: out = ((yw_1 + yw_2) + yw_3) + yw_4 over the token's experts in ascending
   id order -- the reference's index_add order, so only the GEMM sums differ from it.
Accuracy: each k-tile's 16 products are chained in a fresh register and the tile sums added to the
accumulator (180 adds over K = 2880, instead of one 2880-FMA chain); CPU emulation of this order in
tests/test_p51_numerics.py.
"""
import torch  # before tvm, so TVM's CUDA runtime finds the already-loaded CUDA libraries

import tvm
from tvm.script import tirx as T

TOP_K = 4
LIMIT = 7.0
ALPHA = 1.702
BM, BN, BK = 128, 128, 16      # GEMM tile; BM is also the padding of each expert's row segment
THREADS = 256                  # 16 x 16 threads, 8 x 8 outputs each (rows tr*4.., 64 + tr*4..)
VEC = 4
AV = BM * BK // VEC // THREADS  # float4 loads a thread stages per k-tile (A and B alike)


def _make_dispatch(scatter: bool):
    """A CTA per expert.  count: its number of assignments.  scatter: its row offset (segments padded to
    BM rows), the gathered row of each of its assignments in flat (token, choice) order, the token of
    each row (-1 on padding), and the expert of each row tile (-1 past the last segment)."""

    @T.prim_func
    def dispatch(i_h: T.handle, c_h: T.handle, r_h: T.handle, t_h: T.handle, tl_h: T.handle):
        n = T.int32()
        E = T.int32()
        R = T.int32()
        NT = T.int32()
        IDS = T.match_buffer(i_h, (n,), "int64")
        CNT = T.match_buffer(c_h, (E,), "int32")
        ROW = T.match_buffer(r_h, (n,), "int32")
        TOK = T.match_buffer(t_h, (R,), "int32")
        TILES = T.match_buffer(tl_h, (NT,), "int32")
        T.device_entry()
        e = T.cta_id([E])
        tx = T.thread_id([256])
        sm = T.alloc_shared((258,), "int32")
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
        if tx == 0:                                  # exclusive scan of the 256 counts; the padded offset
            run[0] = 0
            for j in T.serial(256):
                run[1] = sm[j]
                sm[j] = run[0]
                run[0] = run[0] + run[1]
            sm[256] = run[0]
            run[1] = 0
            if scatter:
                for e2 in T.serial(e):
                    run[1] = run[1] + T.ceildiv(CNT[e2], BM) * BM
            sm[257] = run[1]
        T.cuda.cta_sync()
        if not scatter:
            if tx == 0:
                CNT[e] = sm[256]
        else:
            total: T.int32 = sm[256]
            off: T.int32 = sm[257]
            end: T.int32 = off + T.ceildiv(total, BM) * BM
            cnt[0] = off + sm[tx]
            for i in T.serial(hi - lo):
                if IDS[lo + i] == T.Cast("int64", e):
                    ROW[lo + i] = cnt[0]
                    TOK[cnt[0]] = (lo + i) // TOP_K
                    cnt[0] = cnt[0] + 1
            for j in T.serial(T.ceildiv(end - off - total - tx, 256)):
                TOK[off + total + tx + j * 256] = -1
            for j in T.serial(T.ceildiv(end // BM - off // BM - tx, 256)):
                TILES[off // BM + tx + j * 256] = e
            if e == E - 1:                           # past the last segment: no rows, no tiles
                for j in T.serial(T.ceildiv(R - end - tx, 256)):
                    TOK[end + tx + j * 256] = -1
                for j in T.serial(T.ceildiv(NT - end // BM - tx, 256)):
                    TILES[end // BM + tx + j * 256] = -1

    return dispatch


def _make_gemm(GLU: bool, N: int, K: int, E: int):
    """GLU: O[r] = GLU(A[TOK[r]] @ W[e] + BIAS[e]) (N = 2 x width of O); else
    O[r] = (A[r] @ W[e] + BIAS[e]) * RW[TOK[r], e] for rows with a token.  e = TILES[row tile];
    W is the [E * K, N] view of the [E, K, N] weights."""
    assert K % BK == 0 and N % VEC == 0, (N, K)
    KT = K // BK
    NO = N // 2 if GLU else N
    RA = THREADS // (BK // VEC)      # A rows staged per pass (64)
    RB = THREADS // (BN // VEC)      # B k-rows staged per pass (8)

    @T.prim_func
    def gemm(a_h: T.handle, t_h: T.handle, tl_h: T.handle, w_h: T.handle, b_h: T.handle, rw_h: T.handle,
             o_h: T.handle):
        arows = T.int32()
        R = T.int32()
        NT = T.int32()
        ntok = T.int32()
        A = T.match_buffer(a_h, (arows, K), "float32", align=16)
        TOK = T.match_buffer(t_h, (R,), "int32")
        TILES = T.match_buffer(tl_h, (NT,), "int32")
        W = T.match_buffer(w_h, (E * K, N), "float32", align=16)
        BIAS = T.match_buffer(b_h, (E, N), "float32")
        RW = T.match_buffer(rw_h, (ntok, E), "float32")
        O = T.match_buffer(o_h, (R, NO), "float32")
        T.device_entry()
        bn, bm = T.cta_id([T.ceildiv(N, BN), NT])      # N tiles fastest: resident CTAs share A rows
        tx = T.thread_id([THREADS])
        a_s = T.alloc_shared((BK, BM + 4), "float32", align=16)
        b_s = T.alloc_shared((BK, BN), "float32", align=16)
        acc = T.alloc_local((64,), "float32")
        tile = T.alloc_local((64,), "float32")
        ra = T.alloc_local((8,), "float32")
        rb = T.alloc_local((8,), "float32")
        pa = T.alloc_local((AV * VEC,), "float32")
        pb = T.alloc_local((AV * VEC,), "float32")
        src = T.alloc_local((AV,), "int32")
        e: T.int32 = TILES[bm]
        if e >= 0:
            tr = T.meta_var(tx // 16)
            tc = T.meta_var(tx % 16)
            ka = T.meta_var(tx % (BK // VEC))
            kb = T.meta_var(tx // (BN // VEC))
            nb = T.meta_var(tx % (BN // VEC))
            bcol = T.meta_var(T.min(bn * (BN // VEC) + nb, N // VEC - 1) * VEC)  # clamped on a partial tile
            for i in T.unroll(AV):
                if GLU:                                # padding rows read token 0, never used
                    src[i] = T.max(TOK[bm * BM + i * RA + tx // (BK // VEC)], 0)
                else:
                    src[i] = bm * BM + i * RA + tx // (BK // VEC)
            for i in T.unroll(64):
                acc[i] = T.float32(0)
            for i in T.unroll(AV):                     # k-tile 0
                T.tile.copy(pa[i * VEC:i * VEC + VEC], A[src[i], ka * VEC:ka * VEC + VEC])
                T.tile.copy(pb[i * VEC:i * VEC + VEC], W[e * K + i * RB + kb, bcol:bcol + VEC])
            for i in T.unroll(AV):
                for q in T.unroll(VEC):
                    a_s[ka * VEC + q, i * RA + tx // (BK // VEC)] = pa[i * VEC + q]
                T.tile.copy(b_s[i * RB + kb, nb * VEC:nb * VEC + VEC], pb[i * VEC:i * VEC + VEC])
            T.cuda.cta_sync()
            for kt in T.serial(KT):
                if kt + 1 < KT:                        # prefetch k-tile kt + 1 into registers
                    for i in T.unroll(AV):
                        T.tile.copy(pa[i * VEC:i * VEC + VEC],
                                    A[src[i], (kt + 1) * BK + ka * VEC:(kt + 1) * BK + ka * VEC + VEC])
                        T.tile.copy(pb[i * VEC:i * VEC + VEC], W[e * K + (kt + 1) * BK + i * RB + kb, bcol:bcol + VEC])
                for i in T.unroll(64):                 # a fresh 16-FMA chain per k-tile
                    tile[i] = T.float32(0)
                for kk in T.unroll(BK):
                    for h in T.unroll(2):
                        T.tile.copy(ra[h * 4:h * 4 + 4], a_s[kk, h * 64 + tr * 4:h * 64 + tr * 4 + 4])
                        T.tile.copy(rb[h * 4:h * 4 + 4], b_s[kk, h * 64 + tc * 4:h * 64 + tc * 4 + 4])
                    for i in T.unroll(8):
                        for j in T.unroll(8):
                            tile[i * 8 + j] = tile[i * 8 + j] + ra[i] * rb[j]
                for i in T.unroll(64):
                    acc[i] = acc[i] + tile[i]
                T.cuda.cta_sync()
                if kt + 1 < KT:
                    for i in T.unroll(AV):
                        for q in T.unroll(VEC):
                            a_s[ka * VEC + q, i * RA + tx // (BK // VEC)] = pa[i * VEC + q]
                        T.tile.copy(b_s[i * RB + kb, nb * VEC:nb * VEC + VEC], pb[i * VEC:i * VEC + VEC])
                T.cuda.cta_sync()
            for i in T.unroll(8):
                r = T.meta_var(bm * BM + tr * 4 + i % 4 + 64 * (i // 4))
                if GLU:
                    for p in T.unroll(4):              # (gate, up) = columns (c, c + 1), c even
                        c = T.meta_var(bn * BN + tc * 4 + (2 * p) % 4 + 64 * (p // 2))
                        if c < N:
                            g: T.float32 = T.min(acc[i * 8 + 2 * p] + BIAS[e, c], T.float32(LIMIT))
                            u: T.float32 = T.max(T.min(acc[i * 8 + 2 * p + 1] + BIAS[e, c + 1], T.float32(LIMIT)),
                                                 T.float32(-LIMIT))
                            ga: T.float64 = T.Cast("float64", g * T.float32(ALPHA))
                            sig: T.float32 = T.Cast("float32", T.float64(1) / (T.float64(1) + T.exp(-ga)))
                            O[r, c // 2] = (u + T.float32(1)) * (g * sig)
                else:
                    tok: T.int32 = TOK[r]
                    if tok >= 0:
                        wt: T.float32 = RW[tok, e]
                        for j in T.unroll(8):
                            c = T.meta_var(bn * BN + tc * 4 + j % 4 + 64 * (j // 4))
                            if c < N:
                                O[r, c] = (acc[i * 8 + j] + BIAS[e, c]) * wt

    return gemm


def _make_combine(D: int):
    """O[t] = sum of Y over t's 4 rows in ascending expert id (index_add's order), a CTA per token."""
    NV = D // VEC

    @T.prim_func
    def combine(y_h: T.handle, i_h: T.handle, r_h: T.handle, o_h: T.handle):
        ntok = T.int32()
        R = T.int32()
        n = T.int32()
        Y = T.match_buffer(y_h, (R, D), "float32", align=16)
        IDS = T.match_buffer(i_h, (n,), "int64")
        ROW = T.match_buffer(r_h, (n,), "int32")
        O = T.match_buffer(o_h, (ntok, D), "float32", align=16)
        T.device_entry()
        t = T.cta_id([ntok])
        tx = T.thread_id([128])
        rows = T.alloc_local((TOP_K,), "int32")
        rank = T.alloc_local((1,), "int32")
        s = T.alloc_local((VEC,), "float32")
        v4 = T.alloc_local((VEC,), "float32")
        for j in T.unroll(TOP_K):
            rank[0] = 0                                # the ids of a token are distinct
            for j2 in T.unroll(TOP_K):
                if IDS[t * TOP_K + j2] < IDS[t * TOP_K + j]:
                    rank[0] = rank[0] + 1
            for r in T.unroll(TOP_K):
                if rank[0] == r:
                    rows[r] = ROW[t * TOP_K + j]
        for it in T.serial(T.ceildiv(NV - tx, 128)):
            v = T.meta_var(tx + it * 128)
            T.tile.copy(s[:], Y[rows[0], v * VEC:v * VEC + VEC])
            for r in T.unroll(1, TOP_K):
                T.tile.copy(v4[:], Y[rows[r], v * VEC:v * VEC + VEC])
                for q in T.unroll(VEC):
                    s[q] = s[q] + v4[q]
            T.tile.copy(O[t, v * VEC:v * VEC + VEC], s[:])

    return combine


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _build(func, arch):
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    with target:
        return tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")


def _prepare(x, router_indices, routing_weights, w_gate_up, b_gate_up, w_down, b_down, arch=None):
    (_, d), (e, _, f2) = x.shape, w_gate_up.shape
    f = f2 // 2
    key = (d, e, f)
    if key not in _COMPILED:
        assert router_indices.shape[1] == TOP_K and d % BK == 0 and f % BK == 0 and d % VEC == 0, (d, f)
        assert e * d * f2 < 2 ** 31 and e * f * d < 2 ** 31, "32-bit weight offsets"
        a = arch or _arch()
        _COMPILED[key] = tuple(_build(fn, a) for fn in (
            _make_dispatch(False), _make_dispatch(True), _make_gemm(True, f2, d, e), _make_gemm(False, d, f, e),
            _make_combine(d)))
    return list(_COMPILED[key])


def solve(x, router_indices, routing_weights, w_gate_up, b_gate_up, w_down, b_down):
    count, scatter, gemm_glu, gemm_down, combine = _prepare(x, router_indices, routing_weights, w_gate_up,
                                                            b_gate_up, w_down, b_down)
    (t, d), (e, _, f2) = x.shape, w_gate_up.shape
    f = f2 // 2
    dev = x.device
    rows = -(-(t * TOP_K + e * (BM - 1)) // BM) * BM    # every pair, every segment padded: no host sync
    ids = router_indices.contiguous().view(-1)
    counts = torch.empty(e, dtype=torch.int32, device=dev)
    row_of = torch.empty(t * TOP_K, dtype=torch.int32, device=dev)
    tok_of = torch.empty(rows, dtype=torch.int32, device=dev)
    tiles = torch.empty(rows // BM, dtype=torch.int32, device=dev)
    h = torch.empty(rows, f, dtype=torch.float32, device=dev)
    yw = torch.empty(rows, d, dtype=torch.float32, device=dev)
    out = torch.empty(t, d, dtype=torch.float32, device=dev)
    rw = routing_weights.contiguous()
    count(ids, counts, row_of, tok_of, tiles)
    scatter(ids, counts, row_of, tok_of, tiles)
    gemm_glu(x.contiguous(), tok_of, tiles, w_gate_up.contiguous().view(e * d, f2), b_gate_up.contiguous(), rw, h)
    gemm_down(h, tok_of, tiles, w_down.contiguous().view(e * f, d), b_down.contiguous(), rw, yw)
    combine(yw, ids, row_of, out)
    return out
