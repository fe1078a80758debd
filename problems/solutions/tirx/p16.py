"""p16 MLA ragged causal prefill, non-absorbed (16 heads, qk 192 / vo 128, bf16) in TIRx: tensor cores, one launch.

A CTA of 4 warps owns one (sequence, tile of QT = 64 queries, head); the tile is found by a scan of qo_indptr
inside the kernel (no host sync; here every sequence is one tile, 63 x 16 = 1008 working CTAs, head fastest so
that surplus CTAs of the bound come last).  Warp w owns query rows 16w .. 16w + 15 of the tile; a warp whose
rows are all past the tile's queries skips the math (it still loads and meets the barriers).

Keys come in blocks of BN = 64 through a two-stage cp.async ring in shared memory (16-byte copies, rows padded
to 400 / 272 bytes so that ldmatrix reads are conflict-free): block kb + 1 is in flight while block kb is used.
Key rows past the sequence are clamped copies of its last key (masked below).  Per block and warp:

* S = Q K^T with mma.sync m16n8k16 (bf16 in, fp32 out): the Q fragments are loaded once from global memory
  (4-byte loads), the K fragments with ldmatrix.x4.  The 12 k16 steps run in chunks of KC steps, each chunk
  into a fresh accumulator then added to S in fp32.  KC = 12 (one chunk): the CPU replay's pessimistic model
  of the tensor core (each step rounded toward zero) puts the lse at 0.52 of its allowance unchunked and 0.50
  with KC = 4 (which costs 23 registers and a small spill); KC is the switch if the GPU says otherwise.
* t = S * sm_scale * log2 e, masked to -1e38 where key > query + kv_len - q_len; an online softmax in base 2 per
  row over the quad (2 xor shuffles), p = 2^(t - m) (ex2.approx), the row sum kept per lane (16 keys a lane a
  block; one quad sum at the end), O rescaled by 2^(m_old - m_new).
* O += P V with P rounded to bf16 in registers (the S fragment layout is the A fragment layout) and the V
  fragments from ldmatrix.x4.trans.

out = O / l (bf16, 4-byte stores straight from the fragments), lse = m + log2 l.
"""
import math

import torch  # before tvm, so TVM's CUDA runtime finds the already-loaded CUDA libraries

import tvm
from tvm.script import tirx as T

QT = 64                # query rows of a tile: 4 warps x 16
BN = 64                # keys per block
KC = 12                # k16 steps per fresh accumulator chunk of S = Q K^T
NEG = -1.0e30
MASKED = -1.0e38
FULL = 0xFFFFFFFF
MMA = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
LDSM = "ldmatrix.sync.aligned.m8n8.x4.shared.b16"
LDSM_T = "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"


def _pack(lo, hi):
    """Two fp32 values as a bf16 pair (lo in the low half), each rounded to nearest even."""
    return T.Cast("uint32", T.reinterpret("uint16", T.Cast("bfloat16", lo))) | T.shift_left(
        T.Cast("uint32", T.reinterpret("uint16", T.Cast("bfloat16", hi))), T.uint32(16))


def _make(H: int, DQK: int, DV: int, qscale: float):
    KP, VP = DQK + 8, DV + 8          # padded smem rows: 16-byte aligned, ldmatrix rows on distinct banks
    KCH, VCH = DQK // 8, DV // 8      # 16-byte chunks per row
    NK = DQK // 16                    # k16 steps of Q K^T
    NO = DV // 8                      # n8 tiles of O
    assert NK % KC == 0 and (BN * KCH) % 128 == 0 and (BN * VCH) % 128 == 0

    @T.inline
    def _load(Ks, Vs, K, V, k0, kend, h, kb, st, tx):
        for c in T.unroll(BN * KCH // 128):
            idx = T.meta_var(tx + c * 128)
            T.ptx["cp.async.cg.shared.global"](
                Ks.ptr_to([st, idx // KCH, (idx % KCH) * 8]),
                K.ptr_to([k0 + T.min(kb * BN + idx // KCH, kend - 1), h, (idx % KCH) * 8]), 16)
        for c in T.unroll(BN * VCH // 128):
            idx = T.meta_var(tx + c * 128)
            T.ptx["cp.async.cg.shared.global"](
                Vs.ptr_to([st, idx // VCH, (idx % VCH) * 8]),
                V.ptr_to([k0 + T.min(kb * BN + idx // VCH, kend - 1), h, (idx % VCH) * 8]), 16)

    @T.prim_func
    def ragged_prefill(q_h: T.handle, k_h: T.handle, v_h: T.handle, qo_h: T.handle, kv_h: T.handle,
                       out_h: T.handle, lse_h: T.handle):
        qr = T.int32()
        kr = T.int32()
        nb1 = T.int32()
        Q = T.match_buffer(q_h, (qr, H, DQK), "bfloat16", align=16)
        K = T.match_buffer(k_h, (kr, H, DQK), "bfloat16", align=16)
        V = T.match_buffer(v_h, (kr, H, DV), "bfloat16", align=16)
        QO = T.match_buffer(qo_h, (nb1,), "int32")
        KV = T.match_buffer(kv_h, (nb1,), "int32")
        OUT = T.match_buffer(out_h, (qr, H, DV), "bfloat16", align=16)
        LSE = T.match_buffer(lse_h, (qr, H), "float32")
        T.device_entry()
        h, tile = T.cta_id([H, qr // QT + nb1 - 1])
        tx = T.thread_id([128])
        pool = T.SMEMPool()
        Ks = pool.alloc((2, BN, KP), "bfloat16", align=128)
        Vs = pool.alloc((2, BN, VP), "bfloat16", align=128)
        pool.commit()
        Qu = T.decl_buffer((qr, H, DQK // 2), "uint32", data=Q.data)
        OUTu = T.decl_buffer((qr, H, DV // 2), "uint32", data=OUT.data)
        sel = T.alloc_local((3,), "int32")          # cum, bsel, tsel
        nn = T.alloc_local((1,), "int32")
        inc = T.alloc_local((1,), "int32")
        below = T.alloc_local((1,), "uint32")
        qa = T.alloc_local((NK * 4,), "uint32")     # Q A-fragments, 4 words per k16 step
        s = T.alloc_local((BN // 2,), "float32")    # S / P: n8 tile nt, element e at nt * 4 + e
        tmp = T.alloc_local((BN // 2,), "float32")
        o = T.alloc_local((NO * 4,), "float32")
        m = T.alloc_local((2,), "float32")          # rows g and g + 8
        l = T.alloc_local((2,), "float32")
        mx = T.alloc_local((2,), "float32")
        corr = T.alloc_local((2,), "float32")
        bw = T.alloc_local((4,), "uint32")
        pa = T.alloc_local((4,), "uint32")
        # (sequence, tile in it) of this CTA's tile: 32 sequences a step, their tile counts summed by an
        # inclusive shuffle scan; the tile lies in the first sequence whose running count passes it.
        sel[0] = 0                                  # tiles before this step's 32 sequences
        sel[1] = -1
        sel[2] = 0
        for c0 in T.serial((nb1 + 30) // 32):
            nn[0] = 0
            if c0 * 32 + tx % 32 < nb1 - 1:
                nn[0] = (QO[c0 * 32 + tx % 32 + 1] - QO[c0 * 32 + tx % 32] + QT - 1) // QT
            inc[0] = nn[0]
            for o in T.unroll(5):
                up: T.int32 = T.tvm_warp_shuffle_up(T.uint32(FULL), inc[0], T.shift_left(1, o), 32, 32)
                if tx % 32 >= T.shift_left(1, o):
                    inc[0] = inc[0] + up
            inc[0] = inc[0] + sel[0]
            below[0] = T.cuda.ballot_sync(T.uint32(FULL), inc[0] <= tile)
            cnt: T.int32 = T.popcount(below[0])
            if sel[1] < 0 and cnt < 32:
                ex: T.int32 = T.tvm_warp_shuffle(T.uint32(FULL), inc[0] - nn[0], cnt, 32, 32)
                sel[1] = c0 * 32 + cnt
                sel[2] = tile - ex
            sel[0] = T.tvm_warp_shuffle(T.uint32(FULL), inc[0], 31, 32, 32)
        if sel[1] >= 0:
            b: T.let = sel[1]
            q0: T.let = QO[b]
            qlen: T.let = QO[b + 1] - q0
            k0: T.let = KV[b]
            off: T.let = KV[b + 1] - k0 - qlen       # query i sees keys j <= i + off
            i0: T.let = sel[2] * QT                   # first query of the tile, in the sequence
            nq: T.let = T.min(QT, qlen - i0)
            kend: T.let = i0 + nq + off               # keys [0, kend) are seen by some row of the tile
            nblk: T.let = (kend + BN - 1) // BN
            w = T.meta_var(tx // 32)
            g = T.meta_var((tx % 32) // 4)
            tq = T.meta_var(tx % 4)
            r_lo: T.let = q0 + i0 + T.min(w * 16 + g, nq - 1)
            r_hi: T.let = q0 + i0 + T.min(w * 16 + g + 8, nq - 1)
            for kk in T.unroll(NK):
                qa[kk * 4 + 0] = Qu[r_lo, h, kk * 8 + tq]
                qa[kk * 4 + 1] = Qu[r_hi, h, kk * 8 + tq]
                qa[kk * 4 + 2] = Qu[r_lo, h, kk * 8 + 4 + tq]
                qa[kk * 4 + 3] = Qu[r_hi, h, kk * 8 + 4 + tq]
            for hh in T.unroll(2):
                m[hh] = T.float32(NEG)
                l[hh] = T.float32(0)
            for i in T.unroll(NO * 4):
                o[i] = T.float32(0)
            _load(Ks, Vs, K, V, k0, kend, h, 0, 0, tx)
            T.ptx["cp.async.commit_group"]()
            for kb in T.serial(nblk):
                if kb + 1 < nblk:
                    _load(Ks, Vs, K, V, k0, kend, h, kb + 1, (kb + 1) % 2, tx)
                T.ptx["cp.async.commit_group"]()
                T.ptx["cp.async.wait_group"](1)
                T.cuda.cta_sync()
                st: T.let = kb % 2
                if w * 16 < nq:
                    # S = Q K^T in chunks of KC k16 steps, each into a zeroed accumulator
                    for i in T.unroll(BN // 2):
                        s[i] = T.float32(0)
                    for kc in T.unroll(NK // KC):
                        for i in T.unroll(BN // 2):
                            tmp[i] = T.float32(0)
                        for k1 in T.unroll(KC):
                            for np_ in T.unroll(BN // 16):
                                T.ptx[LDSM](bw[0], bw[1], bw[2], bw[3], Ks.ptr_to(
                                    [st, np_ * 16 + ((tx % 32) // 16) * 8 + tx % 8,
                                     (kc * KC + k1) * 16 + ((tx % 16) // 8) * 8]))
                                T.ptx[MMA](tmp[np_ * 8 + 0], tmp[np_ * 8 + 1], tmp[np_ * 8 + 2], tmp[np_ * 8 + 3],
                                           qa[(kc * KC + k1) * 4 + 0], qa[(kc * KC + k1) * 4 + 1],
                                           qa[(kc * KC + k1) * 4 + 2], qa[(kc * KC + k1) * 4 + 3], bw[0], bw[1],
                                           tmp[np_ * 8 + 0], tmp[np_ * 8 + 1], tmp[np_ * 8 + 2], tmp[np_ * 8 + 3])
                                T.ptx[MMA](tmp[np_ * 8 + 4], tmp[np_ * 8 + 5], tmp[np_ * 8 + 6], tmp[np_ * 8 + 7],
                                           qa[(kc * KC + k1) * 4 + 0], qa[(kc * KC + k1) * 4 + 1],
                                           qa[(kc * KC + k1) * 4 + 2], qa[(kc * KC + k1) * 4 + 3], bw[2], bw[3],
                                           tmp[np_ * 8 + 4], tmp[np_ * 8 + 5], tmp[np_ * 8 + 6], tmp[np_ * 8 + 7])
                        for i in T.unroll(BN // 2):
                            s[i] = s[i] + tmp[i]
                    # scale, causal mask, row max over the quad
                    for hh in T.unroll(2):
                        mx[hh] = T.float32(MASKED)
                    for nt in T.unroll(BN // 8):
                        for e in T.unroll(4):
                            key = T.meta_var(kb * BN + nt * 8 + tq * 2 + e % 2)
                            row = T.meta_var(i0 + w * 16 + g + (e // 2) * 8)
                            s[nt * 4 + e] = T.if_then_else(key <= row + off, s[nt * 4 + e] * T.float32(qscale),
                                                           T.float32(MASKED))
                            mx[e // 2] = T.max(mx[e // 2], s[nt * 4 + e])
                    for hh in T.unroll(2):
                        mx[hh] = T.max(mx[hh], T.tvm_warp_shuffle_xor(T.uint32(FULL), mx[hh], 1, 32, 32))
                        mx[hh] = T.max(mx[hh], T.tvm_warp_shuffle_xor(T.uint32(FULL), mx[hh], 2, 32, 32))
                        mx[hh] = T.max(m[hh], mx[hh])
                        corr[hh] = T.exp2(m[hh] - mx[hh])
                        m[hh] = mx[hh]
                        l[hh] = l[hh] * corr[hh]
                    for nt in T.unroll(BN // 8):
                        for e in T.unroll(4):
                            s[nt * 4 + e] = T.exp2(s[nt * 4 + e] - mx[e // 2])
                            l[e // 2] = l[e // 2] + s[nt * 4 + e]
                    for i in T.unroll(NO * 4):
                        o[i] = o[i] * corr[(i % 4) // 2]
                    # O += P V
                    for kk in T.unroll(BN // 16):
                        pa[0] = _pack(s[kk * 8 + 0], s[kk * 8 + 1])
                        pa[1] = _pack(s[kk * 8 + 2], s[kk * 8 + 3])
                        pa[2] = _pack(s[kk * 8 + 4], s[kk * 8 + 5])
                        pa[3] = _pack(s[kk * 8 + 6], s[kk * 8 + 7])
                        for np_ in T.unroll(NO // 2):
                            T.ptx[LDSM_T](bw[0], bw[1], bw[2], bw[3], Vs.ptr_to(
                                [st, kk * 16 + ((tx % 16) // 8) * 8 + tx % 8, np_ * 16 + ((tx % 32) // 16) * 8]))
                            T.ptx[MMA](o[np_ * 8 + 0], o[np_ * 8 + 1], o[np_ * 8 + 2], o[np_ * 8 + 3],
                                       pa[0], pa[1], pa[2], pa[3], bw[0], bw[1],
                                       o[np_ * 8 + 0], o[np_ * 8 + 1], o[np_ * 8 + 2], o[np_ * 8 + 3])
                            T.ptx[MMA](o[np_ * 8 + 4], o[np_ * 8 + 5], o[np_ * 8 + 6], o[np_ * 8 + 7],
                                       pa[0], pa[1], pa[2], pa[3], bw[2], bw[3],
                                       o[np_ * 8 + 4], o[np_ * 8 + 5], o[np_ * 8 + 6], o[np_ * 8 + 7])
                T.cuda.cta_sync()
            if w * 16 < nq:
                for hh in T.unroll(2):
                    l[hh] = l[hh] + T.tvm_warp_shuffle_xor(T.uint32(FULL), l[hh], 1, 32, 32)
                    l[hh] = l[hh] + T.tvm_warp_shuffle_xor(T.uint32(FULL), l[hh], 2, 32, 32)
                    corr[hh] = T.float32(1) / l[hh]
                for hh in T.unroll(2):
                    if w * 16 + g + hh * 8 < nq:
                        orow = T.meta_var(q0 + i0 + w * 16 + g + hh * 8)
                        for nt in T.unroll(NO):
                            OUTu[orow, h, nt * 4 + tq] = _pack(o[nt * 4 + hh * 2] * corr[hh],
                                                               o[nt * 4 + hh * 2 + 1] * corr[hh])
                        if tq == 0:
                            LSE[orow, h] = m[hh] + T.log2(l[hh])

    return ragged_prefill


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _build(func, arch):
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    with target:
        return tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")


def _prepare(q, k, v, qo_indptr, kv_indptr, sm_scale, arch=None):
    heads, dqk = q.shape[1], q.shape[2]
    kv_heads, dv = k.shape[1], v.shape[2]
    assert heads == kv_heads and dqk % 64 == 0 and dv % 16 == 0, "one K/V head per q head (MLA prefill)"
    key = (heads, dqk, dv, float(sm_scale))
    if key not in _COMPILED:     # the problem's tensors come contiguous: checked once, passed as they are
        assert all(t.is_contiguous() for t in (q, k, v, qo_indptr, kv_indptr))
        qscale = float(sm_scale) * math.log2(math.e)
        _COMPILED[key] = (_build(_make(heads, dqk, dv, qscale), arch or _arch()),)
    return list(_COMPILED[key])


def solve(q, k, v, qo_indptr, kv_indptr, sm_scale):
    (prefill,) = _prepare(q, k, v, qo_indptr, kv_indptr, sm_scale)
    out = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[0], q.shape[1], dtype=torch.float32, device=q.device)
    prefill(q, k, v, qo_indptr, kv_indptr, out, lse)
    return out, lse
