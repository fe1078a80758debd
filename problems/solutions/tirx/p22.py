"""p22 MiniMax-M3 per-head Gemma RMSNorm + partial NeoX RoPE + dual paged-cache insert, in TIRx.

One fused kernel: a warp per (token, head) of the fused row [q 16 | k 4 | v 4 | index_q 4 | index_k 1]
x 128; each lane holds 4 of the 128 dims.  Normed heads: sum of squares by warp shuffles (fp32),
x * rsqrt(mean + eps) * (1 + w) rounded to bf16 (as the reference rounds), then the NeoX rotation
of the first 64 dims in fp32 on those rounded values (partner dims i, i + 32 sit in lanes l, l ^ 8),
rounded to bf16.  q and index_q go to the outputs; k and v go straight into
kv_cache[block, head, offset, 0:128 / 128:256] and index_k into index_cache[block, offset] (in place).
"""
import torch  # before tvm, so TVM's CUDA runtime finds the already-loaded CUDA libraries

import tvm
from tvm.script import tirx as T

D = 128
H, KV, IH = 16, 4, 4
TOT = H + 2 * KV + IH + 1        # 29 head rows per token
EPS = 1e-6
WARPS = 4


def _make(BS: int, RH: int):
    C = TOT * D

    @T.prim_func
    def norm_rope_dual_insert(qkv_h: T.handle, qw_h: T.handle, kw_h: T.handle, iqw_h: T.handle, ikw_h: T.handle,
                              pos_h: T.handle, cs_h: T.handle, slot_h: T.handle, islot_h: T.handle,
                              kv_h: T.handle, idx_h: T.handle, q_h: T.handle, iq_h: T.handle):
        ntok = T.int32()
        mp = T.int32()
        kvrows = T.int32()
        idxrows = T.int32()
        qrows = T.int32()
        iqrows = T.int32()
        QKV = T.match_buffer(qkv_h, (ntok, C), "bfloat16", align=16)
        QW = T.match_buffer(qw_h, (D,), "bfloat16", align=16)
        KW = T.match_buffer(kw_h, (D,), "bfloat16", align=16)
        IQW = T.match_buffer(iqw_h, (D,), "bfloat16", align=16)
        IKW = T.match_buffer(ikw_h, (D,), "bfloat16", align=16)
        POS = T.match_buffer(pos_h, (ntok,), "int64")
        CS = T.match_buffer(cs_h, (mp, 2 * RH), "bfloat16", align=16)
        SLOT = T.match_buffer(slot_h, (ntok,), "int64")
        ISLOT = T.match_buffer(islot_h, (ntok,), "int64")
        KVC = T.match_buffer(kv_h, (kvrows, D), "bfloat16", align=16)
        IDX = T.match_buffer(idx_h, (idxrows, D), "bfloat16", align=16)
        QO = T.match_buffer(q_h, (qrows, D), "bfloat16", align=16)
        IQO = T.match_buffer(iq_h, (iqrows, D), "bfloat16", align=16)
        T.device_entry()
        t, hb = T.cta_id([ntok, (TOT + WARPS - 1) // WARPS])
        tx = T.thread_id([32 * WARPS])
        xr = T.alloc_local((4,), "bfloat16")
        wr = T.alloc_local((4,), "bfloat16")
        nb = T.alloc_local((4,), "bfloat16")     # the normed head, rounded to bf16
        yr = T.alloc_local((4,), "bfloat16")
        acc = T.alloc_local((1,), "float32")
        lane: T.let = tx % 32
        hh: T.let = hb * WARPS + tx // 32
        if hh < TOT:                              # the 3 spare warps of the last CTA leave together
            T.tile.copy(xr[:], QKV[t, hh * D + lane * 4:hh * D + lane * 4 + 4])
            if hh >= H + KV and hh < H + 2 * KV:   # v: copied unchanged into the cache
                slot: T.let = T.Cast("int32", SLOT[t])
                if slot >= 0:
                    row: T.let = (((slot // BS) * KV + hh - H - KV) * BS + slot % BS) * 2 + 1
                    T.tile.copy(KVC[row, lane * 4:lane * 4 + 4], xr[:])
            else:
                if hh < H:
                    T.tile.copy(wr[:], QW[lane * 4:lane * 4 + 4])
                elif hh < H + KV:
                    T.tile.copy(wr[:], KW[lane * 4:lane * 4 + 4])
                elif hh < TOT - 1:
                    T.tile.copy(wr[:], IQW[lane * 4:lane * 4 + 4])
                else:
                    T.tile.copy(wr[:], IKW[lane * 4:lane * 4 + 4])
                acc[0] = T.float32(0)
                for e in T.unroll(4):
                    acc[0] = acc[0] + T.Cast("float32", xr[e]) * T.Cast("float32", xr[e])
                ss: T.float32 = T.cuda.warp_sum(acc[0])
                inv: T.float32 = T.rsqrt(ss / T.float32(D) + T.float32(EPS))
                for e in T.unroll(4):
                    nb[e] = T.Cast("bfloat16", T.Cast("float32", xr[e]) * inv
                                   * (T.float32(1) + T.Cast("float32", wr[e])))
                p: T.let = T.Cast("int32", POS[t])
                for e in T.unroll(4):
                    n: T.float32 = T.Cast("float32", nb[e])
                    other: T.float32 = T.tvm_warp_shuffle_xor(T.uint32(0xFFFFFFFF), n, RH // 4, 32, 32)
                    d = T.meta_var(lane * 4 + e)
                    if d < RH:
                        yr[e] = T.Cast("bfloat16", n * T.Cast("float32", CS[p, d])
                                       - other * T.Cast("float32", CS[p, RH + d]))
                    elif d < 2 * RH:
                        yr[e] = T.Cast("bfloat16", n * T.Cast("float32", CS[p, d - RH])
                                       + other * T.Cast("float32", CS[p, d]))
                    else:
                        yr[e] = nb[e]
                if hh < H:
                    T.tile.copy(QO[t * H + hh, lane * 4:lane * 4 + 4], yr[:])
                elif hh < H + KV:
                    slot: T.let = T.Cast("int32", SLOT[t])
                    if slot >= 0:
                        row: T.let = (((slot // BS) * KV + hh - H) * BS + slot % BS) * 2
                        T.tile.copy(KVC[row, lane * 4:lane * 4 + 4], yr[:])
                elif hh < TOT - 1:
                    T.tile.copy(IQO[t * IH + hh - H - 2 * KV, lane * 4:lane * 4 + 4], yr[:])
                else:
                    islot: T.let = T.Cast("int32", ISLOT[t])   # index_cache [blocks, BS, 128] rows are slots
                    if islot >= 0:
                        T.tile.copy(IDX[islot, lane * 4:lane * 4 + 4], yr[:])

    return norm_rope_dual_insert


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _build(func, arch):
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    with target:
        return tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")


def _shape_key(qkv, cos_sin_cache, kv_cache):
    _, kv_heads, block_size, width = kv_cache.shape
    assert (kv_heads, width, qkv.shape[1]) == (KV, 2 * D, TOT * D)
    return block_size, cos_sin_cache.shape[1] // 2


def _prepare(qkv, q_norm_weight, k_norm_weight, index_q_norm_weight, index_k_norm_weight, positions,
             cos_sin_cache, slot_mapping, index_slot_mapping, kv_cache, index_cache, arch=None):
    key = _shape_key(qkv, cos_sin_cache, kv_cache)
    if key not in _COMPILED:
        assert key[1] % 4 == 0 and 2 * key[1] <= D
        _COMPILED[key] = _build(_make(*key), arch or _arch())
    return [_COMPILED[key]]


def solve(qkv, q_norm_weight, k_norm_weight, index_q_norm_weight, index_k_norm_weight, positions,
          cos_sin_cache, slot_mapping, index_slot_mapping, kv_cache, index_cache):
    (exe,) = _prepare(qkv, q_norm_weight, k_norm_weight, index_q_norm_weight, index_k_norm_weight, positions,
                      cos_sin_cache, slot_mapping, index_slot_mapping, kv_cache, index_cache)
    tokens = qkv.shape[0]
    q = torch.empty(tokens, H, D, dtype=qkv.dtype, device=qkv.device)
    index_q = torch.empty(tokens, IH, D, dtype=qkv.dtype, device=qkv.device)
    exe(qkv.contiguous(), q_norm_weight.contiguous(), k_norm_weight.contiguous(),
        index_q_norm_weight.contiguous(), index_k_norm_weight.contiguous(), positions.contiguous(),
        cos_sin_cache.contiguous(), slot_mapping.contiguous(), index_slot_mapping.contiguous(),
        kv_cache.view(-1, D), index_cache.view(-1, D), q.view(-1, D), index_q.view(-1, D))
    return q, index_q
