"""p51 gpt-oss sparse experts from given top-4 routing (fp32 throughout) in CuTe DSL.

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
   (up + 1) * gate * sigmoid(1.702 gate) in the reference's fp32 order -> h [rows, 2880].
3. GEMM 2, same kernel: y = h @ down[e] + bias, times routing_weights[token, e] (the reference's
   two fp32 roundings) -> yw [rows, 2880].
4. Combine, a CTA per token: out = ((yw_1 + yw_2) + yw_3) + yw_4 over the token's experts in ascending
   id order -- the reference's index_add order, so only the GEMM sums differ from it.
Accuracy: each k-tile's 16 products are chained in a fresh register and the tile sums added to the
accumulator (180 adds over K = 2880, instead of one 2880-FMA chain); CPU emulation of this order in
tests/test_p51_numerics.py.
"""
import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

TOP_K = 4
LIMIT = 7.0
ALPHA = 1.702
BM, BN, BK = 128, 128, 16      # GEMM tile; BM is also the padding of each expert's row segment
THREADS = 256                  # 16 x 16 threads, 8 x 8 outputs each (rows tr*4.., 64 + tr*4..)
VEC = 4
AV = BM * BK // VEC // THREADS  # float4 loads a thread stages per k-tile (A and B alike)


class Dispatch:
    """A CTA per expert.  count: its number of assignments.  scatter: its row offset (segments padded to
    BM rows), the gathered row of each of its assignments in flat (token, choice) order, the token of
    each row (-1 on padding), and the expert of each row tile (-1 past the last segment)."""

    def __init__(self, scatter: bool):
        self.scatter = scatter

    @cute.jit
    def __call__(self, ids, counts, row_of, tok_of, tiles, stream):
        self.kernel(ids, counts, row_of, tok_of, tiles).launch(grid=[counts.shape[0], 1, 1], block=[256, 1, 1],
                                                               stream=stream)

    @cute.kernel
    def kernel(self, ids: cute.Tensor, counts: cute.Tensor, row_of: cute.Tensor, tok_of: cute.Tensor,
               tiles: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        e, _, _ = cute.arch.block_idx()
        n = ids.shape[0]
        chunk = (n + 255) // 256                     # thread tidx scans flat assignments [lo, hi) in order
        lo = cutlass.min(tidx * chunk, n)
        hi = cutlass.min(lo + chunk, n)
        sm = cutlass.memory.SmemAllocator().allocate_tensor(Int32, cute.make_layout(258))
        e64 = cutlass.Int64(e)
        c = Int32(0)
        for i in cutlass.range(lo, hi, unroll=1):
            if ids[i] == e64:
                c = c + 1
        sm[tidx] = c
        cute.arch.sync_threads()
        if tidx == 0:                                # exclusive scan of the 256 counts; the padded offset
            run = Int32(0)
            for j in cutlass.range(256, unroll=1):
                cj = sm[j]
                sm[j] = run
                run = run + cj
            sm[256] = run
            off = Int32(0)
            if cutlass.const_expr(self.scatter):
                for e2 in cutlass.range(e, unroll=1):
                    off = off + (counts[e2] + BM - 1) // BM * BM
            sm[257] = off
        cute.arch.sync_threads()
        total = sm[256]
        if cutlass.const_expr(not self.scatter):
            if tidx == 0:
                counts[e] = total
        else:
            off = sm[257]
            row = off + sm[tidx]
            for i in cutlass.range(lo, hi, unroll=1):
                if ids[i] == e64:
                    row_of[i] = row
                    tok_of[row] = i // TOP_K
                    row = row + 1
            end = off + (total + BM - 1) // BM * BM
            for r in cutlass.range(off + total + tidx, end, 256, unroll=1):
                tok_of[r] = Int32(-1)
            for b in cutlass.range(off // BM + tidx, end // BM, 256, unroll=1):
                tiles[b] = e
            if e == counts.shape[0] - 1:             # past the last segment: no rows, no tiles
                for r in cutlass.range(end + tidx, tok_of.shape[0], 256, unroll=1):
                    tok_of[r] = Int32(-1)
                for b in cutlass.range(end // BM + tidx, tiles.shape[0], 256, unroll=1):
                    tiles[b] = Int32(-1)


class Gemm:
    """glu: out[r] = GLU(x[tok_of[r]] @ W[e] + bias[e]) (N = 2 x width of out); else
    out[r] = (a[r] @ W[e] + bias[e]) * rw[tok_of[r], e] for rows with a token.  e = tiles[row tile];
    W is the [E * K, N] view of the [E, K, N] weights."""

    def __init__(self, glu: bool, n: int, k: int):
        assert k % BK == 0 and n % VEC == 0, (n, k)
        self.glu, self.N, self.K = glu, n, k

    @cute.jit
    def __call__(self, a, tok_of, tiles, w, bias, rw, out, stream):
        grid = [(self.N + BN - 1) // BN, tiles.shape[0], 1]   # N tiles fastest: resident CTAs share A rows
        self.kernel(a, tok_of, tiles, w, bias, rw, out).launch(grid=grid, block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, a: cute.Tensor, tok_of: cute.Tensor, tiles: cute.Tensor, w: cute.Tensor, bias: cute.Tensor,
               rw: cute.Tensor, out: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bn, bm, _ = cute.arch.block_idx()
        e = tiles[bm]
        if e >= 0:
            alloc = cutlass.memory.SmemAllocator()
            a_s = alloc.allocate_tensor(Float32, cute.make_layout((BK, BM + 4), stride=(BM + 4, 1)),
                                        byte_alignment=16)
            b_s = alloc.allocate_tensor(Float32, cute.make_layout((BK, BN), stride=(BN, 1)), byte_alignment=16)
            row0 = bm * BM
            col0 = bn * BN
            tr = tidx // 16
            tc = tidx % 16
            # staging: A float4 (row i * 64 + tidx // 4, k 4 * (tidx % 4)); B float4 (k i * 8 + tidx // 32,
            # column 4 * (tidx % 32), clamped to the last float4 for the loads of a partial N tile)
            ka = tidx % (BK // VEC)
            kb = tidx // (BN // VEC)
            nb = tidx % (BN // VEC)
            bcol = cutlass.min(col0 + nb * VEC, self.N - VEC) // VEC
            src = cute.make_rmem_tensor((AV,), Int32)
            for i in cutlass.range_constexpr(AV):
                ar = row0 + i * (THREADS // (BK // VEC)) + tidx // (BK // VEC)
                if cutlass.const_expr(self.glu):
                    src[i] = cutlass.max(tok_of[ar], Int32(0))   # padding rows read token 0, never used
                else:
                    src[i] = ar
            wrow = e * self.K + kb
            pa = cute.make_rmem_tensor((VEC, AV), Float32)
            pb = cute.make_rmem_tensor((VEC, AV), Float32)
            acc = cute.make_rmem_tensor((64,), Float32)
            acc.fill(0.0)
            tile = cute.make_rmem_tensor((64,), Float32)
            ra = cute.make_rmem_tensor((VEC, 2), Float32)
            rb = cute.make_rmem_tensor((VEC, 2), Float32)
            kt_n = self.K // BK
            self.load(a, w, src, ka, wrow, bcol, Int32(0), pa, pb)
            self.store(a_s, b_s, tidx, ka, kb, nb, pa, pb)
            cute.arch.sync_threads()
            for kt in cutlass.range(kt_n, unroll=1):
                if kt + 1 < kt_n:
                    self.load(a, w, src, ka, wrow, bcol, kt + 1, pa, pb)
                tile.fill(0.0)                       # a fresh 16-FMA chain per k-tile
                for kk in cutlass.range_constexpr(BK):
                    for h in cutlass.range_constexpr(2):
                        cute.autovec_copy(cute.zipped_divide(a_s[kk, None], (VEC,))[None, h * 16 + tr], ra[None, h])
                        cute.autovec_copy(cute.zipped_divide(b_s[kk, None], (VEC,))[None, h * 16 + tc], rb[None, h])
                    for i in cutlass.range_constexpr(8):
                        for j in cutlass.range_constexpr(8):
                            tile[i * 8 + j] = tile[i * 8 + j] + ra[i % 4, i // 4] * rb[j % 4, j // 4]
                for i in cutlass.range_constexpr(64):
                    acc[i] = acc[i] + tile[i]
                cute.arch.sync_threads()
                if kt + 1 < kt_n:
                    self.store(a_s, b_s, tidx, ka, kb, nb, pa, pb)
                cute.arch.sync_threads()
            self.epilogue(acc, tok_of, bias, rw, out, e, row0 + tr * 4, col0 + tc * 4)

    @cute.jit
    def load(self, a, w, src, ka, wrow, bcol, kt, pa, pb):
        for i in cutlass.range_constexpr(AV):
            cute.autovec_copy(cute.zipped_divide(a[src[i], None], (VEC,))[None, kt * (BK // VEC) + ka], pa[None, i])
            cute.autovec_copy(cute.zipped_divide(w[wrow + kt * BK + i * (THREADS // (BN // VEC)), None], (VEC,))[
                None, bcol], pb[None, i])

    @cute.jit
    def store(self, a_s, b_s, tidx, ka, kb, nb, pa, pb):
        for i in cutlass.range_constexpr(AV):
            ar = i * (THREADS // (BK // VEC)) + tidx // (BK // VEC)
            for q in cutlass.range_constexpr(VEC):
                a_s[ka * VEC + q, ar] = pa[q, i]
            cute.autovec_copy(pb[None, i], cute.zipped_divide(b_s[i * (THREADS // (BN // VEC)) + kb, None],
                                                              (VEC,))[None, nb])

    @cute.jit
    def epilogue(self, acc, tok_of, bias, rw, out, e, r0, c0):
        for i in cutlass.range_constexpr(8):
            r = r0 + i % 4 + 64 * (i // 4)
            if cutlass.const_expr(self.glu):
                for p in cutlass.range_constexpr(4):     # (gate, up) = columns (c, c + 1), c even
                    c = c0 + (2 * p) % 4 + 64 * (p // 2)
                    if c < self.N:
                        g = cutlass.min(acc[i * 8 + 2 * p] + bias[e, c], Float32(LIMIT))
                        u = cutlass.max(cutlass.min(acc[i * 8 + 2 * p + 1] + bias[e, c + 1], Float32(LIMIT)),
                                        Float32(-LIMIT))
                        sig = Float32(1.0) / (Float32(1.0) + cute.math.exp(-(g * Float32(ALPHA))))
                        out[r, c // 2] = (u + Float32(1.0)) * (g * sig)
            else:
                tok = tok_of[r]
                if tok >= 0:
                    wt = rw[tok, e]
                    for j in cutlass.range_constexpr(8):
                        c = c0 + j % 4 + 64 * (j // 4)
                        if c < self.N:
                            out[r, c] = (acc[i * 8 + j] + bias[e, c]) * wt


class Combine:
    """out[t] = sum of yw over t's 4 rows in ascending expert id (index_add's order), a CTA per token."""

    def __init__(self, hidden: int):
        self.nv = hidden // VEC

    @cute.jit
    def __call__(self, yw, ids, row_of, out, stream):
        self.kernel(yw, ids, row_of, out).launch(grid=[out.shape[0], 1, 1], block=[128, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, yw: cute.Tensor, ids: cute.Tensor, row_of: cute.Tensor, out: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        t, _, _ = cute.arch.block_idx()
        rows = cute.make_rmem_tensor((TOP_K,), Int32)
        for j in cutlass.range_constexpr(TOP_K):
            rank = Int32(0)                          # the ids of a token are distinct
            for j2 in cutlass.range_constexpr(TOP_K):
                if ids[t * TOP_K + j2] < ids[t * TOP_K + j]:
                    rank = rank + 1
            for r in cutlass.range_constexpr(TOP_K):
                if rank == r:
                    rows[r] = row_of[t * TOP_K + j]
        v4 = cute.make_rmem_tensor((VEC,), Float32)
        s = cute.make_rmem_tensor((VEC,), Float32)
        for v in cutlass.range(tidx, self.nv, 128, unroll=1):
            cute.autovec_copy(cute.zipped_divide(yw[rows[0], None], (VEC,))[None, v], s)
            for r in cutlass.range_constexpr(1, TOP_K):
                cute.autovec_copy(cute.zipped_divide(yw[rows[r], None], (VEC,))[None, v], v4)
                for q in cutlass.range_constexpr(VEC):
                    s[q] = s[q] + v4[q]
            cute.autovec_copy(s, cute.zipped_divide(out[t, None], (VEC,))[None, v])


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _rows(dtype, shape):
    return make_fake_compact_tensor(dtype, shape, stride_order=tuple(range(len(shape) - 1, -1, -1)), assumed_align=16)


def _prepare(x, router_indices, routing_weights, w_gate_up, b_gate_up, w_down, b_down, arch=None):
    (_, d), (e, _, f2) = x.shape, w_gate_up.shape
    f = f2 // 2
    key = (d, e, f)
    if key not in _COMPILED:
        assert router_indices.shape[1] == TOP_K and d % BK == 0 and f % BK == 0 and d % VEC == 0, (d, f)
        assert e * d * f2 < 2 ** 31 and e * f * d < 2 ** 31, "32-bit weight offsets"
        opts = f"--gpu-arch {arch or _arch()} --enable-tvm-ffi"
        st = make_fake_stream(use_tvm_ffi_env_stream=True)
        t, r, nt, n = cute.sym_int(), cute.sym_int(), cute.sym_int(), cute.sym_int()
        f32, i32 = Float32, Int32
        tiles, tok_of, rw = _rows(i32, (nt,)), _rows(i32, (r,)), _rows(f32, (t, e))
        _COMPILED[key] = (
            cute.compile(Dispatch(False), _rows(cutlass.Int64, (n,)), _rows(i32, (e,)), _rows(i32, (n,)), tok_of,
                         tiles, st, options=opts),
            cute.compile(Dispatch(True), _rows(cutlass.Int64, (n,)), _rows(i32, (e,)), _rows(i32, (n,)), tok_of,
                         tiles, st, options=opts),
            cute.compile(Gemm(True, f2, d), _rows(f32, (t, d)), tok_of, tiles, _rows(f32, (e * d, f2)),
                         _rows(f32, (e, f2)), rw, _rows(f32, (r, f)), st, options=opts),
            cute.compile(Gemm(False, d, f), _rows(f32, (r, f)), tok_of, tiles, _rows(f32, (e * f, d)),
                         _rows(f32, (e, d)), rw, _rows(f32, (r, d)), st, options=opts),
            cute.compile(Combine(d), _rows(f32, (r, d)), _rows(cutlass.Int64, (n,)), _rows(i32, (n,)),
                         _rows(f32, (t, d)), st, options=opts))
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
