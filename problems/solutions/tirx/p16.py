"""p16 MLA ragged causal prefill, non-absorbed (16 heads, qk 192 / vo 128, bf16) in TIRx: a warp per row tile.

Work item = (sequence, tile of QT queries) x kv head, found by a scan of qo_indptr inside the kernel (no
host sync).  A warp owns the R = QT x G (query, head) rows of its tile that read one kv head, so each K
and V row it loads serves all R rows (here 8 queries of one head: every head has its own K and V); a
lane holds DQK/32 (6) dims of q and K and DV/32 (4) dims of V and of the output.  Per key: R dot
products summed over the warp with butterfly shuffles, the causal mask (key <= query + kv_len - q_len,
decided per row and the same on every lane) and an online softmax in base 2 (q pre-scaled by
sm_scale*log2 e).  The warp walks its keys once up to the tile's last visible key and writes out = acc /
l (bf16) and lse = m + log2 l directly: no partials, no merge.
"""
import math

import torch  # before tvm, so TVM's CUDA runtime finds the already-loaded CUDA libraries

import tvm
from tvm.script import tirx as T

QT = 8                 # queries per warp tile: 8 consecutive queries of one head share each K/V row load
WARPS = 4
UNROLL = 4
NEG = -1.0e30


def _make(KVH: int, G: int, DQK: int, DV: int, qscale: float):
    H = KVH * G
    R = QT * G
    VK, VV = DQK // 32, DV // 32

    @T.prim_func
    def ragged_prefill(q_h: T.handle, k_h: T.handle, v_h: T.handle, qo_h: T.handle, kv_h: T.handle,
                       out_h: T.handle, lse_h: T.handle):
        qr = T.int32()
        kr = T.int32()
        nb1 = T.int32()
        Q = T.match_buffer(q_h, (qr, DQK), "bfloat16", align=16)
        K = T.match_buffer(k_h, (kr, DQK), "bfloat16", align=16)
        V = T.match_buffer(v_h, (kr, DV), "bfloat16", align=16)
        QO = T.match_buffer(qo_h, (nb1,), "int32")
        KV = T.match_buffer(kv_h, (nb1,), "int32")
        OUT = T.match_buffer(out_h, (qr, DV), "bfloat16", align=16)
        LSE = T.match_buffer(lse_h, (qr,), "float32")
        T.device_entry()
        bx, g = T.cta_id([T.ceildiv(qr // (H * QT) + nb1 - 1, WARPS), KVH])
        tx = T.thread_id([32 * WARPS])
        sel = T.alloc_local((3,), "int32")          # cum, bsel, tsel
        rq = T.alloc_local((VK,), "bfloat16")
        qf = T.alloc_local((R * VK,), "float32")
        m = T.alloc_local((R,), "float32")
        l = T.alloc_local((R,), "float32")
        acc = T.alloc_local((R * VV,), "float32")
        rk = T.alloc_local((UNROLL * VK,), "bfloat16")
        rv = T.alloc_local((UNROLL * VV,), "bfloat16")
        rows = T.alloc_local((UNROLL,), "int32")
        ro = T.alloc_local((VV,), "bfloat16")
        part = T.alloc_local((1,), "float32")
        tile: T.let = bx * WARPS + tx // 32
        ck = T.meta_var((tx % 32) * VK)
        cv = T.meta_var((tx % 32) * VV)
        sel[0] = 0
        sel[1] = -1
        sel[2] = 0
        for bb in T.serial(nb1 - 1):
            n: T.let = (QO[bb + 1] - QO[bb] + QT - 1) // QT
            if sel[1] < 0:
                if tile < sel[0] + n:
                    sel[1] = bb
                    sel[2] = tile - sel[0]
            sel[0] = sel[0] + n
        if sel[1] >= 0:
            b: T.let = sel[1]
            qlen: T.let = QO[b + 1] - QO[b]
            k0: T.let = KV[b]
            off: T.let = KV[b + 1] - k0 - qlen          # query i sees keys j <= i + off
            i0: T.let = sel[2] * QT                      # first query of the tile, in the sequence
            nq: T.let = T.min(QT, qlen - i0)
            kend: T.let = i0 + nq + off                  # keys [0, kend) are seen by some row of the tile
            for r in T.unroll(R):
                T.tile.copy(rq[:], Q[(QO[b] + i0 + T.min(r // G, nq - 1)) * H + g * G + r % G, ck:ck + VK])
                for e in T.unroll(VK):
                    qf[r * VK + e] = T.Cast("float32", rq[e]) * T.float32(qscale)
                m[r] = T.float32(NEG)
                l[r] = T.float32(0)
                for e in T.unroll(VV):
                    acc[r * VV + e] = T.float32(0)
            for it in T.serial(T.ceildiv(kend, UNROLL)):
                j: T.let = it * UNROLL
                for uu in T.unroll(UNROLL):
                    rows[uu] = (k0 + T.min(j + uu, kend - 1)) * KVH + g
                for uu in T.unroll(UNROLL):
                    T.tile.copy(rk[uu * VK:uu * VK + VK], K[rows[uu], ck:ck + VK])
                    T.tile.copy(rv[uu * VV:uu * VV + VV], V[rows[uu], cv:cv + VV])
                for uu in T.unroll(UNROLL):
                    for r in T.unroll(R):
                        part[0] = T.float32(0)
                        for e in T.unroll(VK):
                            part[0] = part[0] + qf[r * VK + e] * T.Cast("float32", rk[uu * VK + e])
                        sc: T.float32 = T.cuda.warp_sum(part[0])
                        if j + uu <= i0 + r // G + off:          # causal (also ends the last partial step)
                            m_new: T.float32 = T.max(m[r], sc)
                            corr: T.float32 = T.exp2(m[r] - m_new)
                            p: T.float32 = T.exp2(sc - m_new)
                            l[r] = l[r] * corr + p
                            for e in T.unroll(VV):
                                acc[r * VV + e] = acc[r * VV + e] * corr + p * T.Cast("float32", rv[uu * VV + e])
                            m[r] = m_new
            for r in T.unroll(R):
                if r // G < nq:
                    orow: T.let = (QO[b] + i0 + r // G) * H + g * G + r % G
                    inv: T.float32 = T.float32(1) / l[r]
                    for e in T.unroll(VV):
                        ro[e] = T.Cast("bfloat16", acc[r * VV + e] * inv)
                    T.tile.copy(OUT[orow, cv:cv + VV], ro[:])
                    if tx % 32 == 0:
                        LSE[orow] = m[r] + T.log2(l[r])

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
    assert heads % kv_heads == 0 and dqk % 32 == 0 and dv % 32 == 0
    key = (heads, kv_heads, dqk, dv, float(sm_scale))
    if key not in _COMPILED:
        qscale = float(sm_scale) * math.log2(math.e)
        _COMPILED[key] = (_build(_make(kv_heads, heads // kv_heads, dqk, dv, qscale), arch or _arch()),)
    return list(_COMPILED[key])


def solve(q, k, v, qo_indptr, kv_indptr, sm_scale):
    (prefill,) = _prepare(q, k, v, qo_indptr, kv_indptr, sm_scale)
    total_q, heads, dqk = q.shape
    dv = v.shape[2]
    out = torch.empty(total_q * heads, dv, dtype=q.dtype, device=q.device)
    lse = torch.empty(total_q * heads, dtype=torch.float32, device=q.device)
    prefill(q.contiguous().view(-1, dqk), k.contiguous().view(-1, dqk), v.contiguous().view(-1, dv),
            qo_indptr.contiguous(), kv_indptr.contiguous(), out, lse)
    return out.view(total_q, heads, dv), lse.view(total_q, heads)
