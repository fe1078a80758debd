"""p19 GLM-4.5 q/k RMSNorm + partial NeoX RoPE + paged KV write (in place), in TIRx.

One fused kernel: a warp per (token, head) over the fused qkv row (q heads, then k heads, then v
heads); each lane holds 4 of the 128 dims.  q/k heads: RMSNorm (warp shuffle sum, fp32), weight,
NeoX rotation of the first 64 dims with the bf16 cos/sin table (partner dims i, i+32 sit in lanes
l, l^8), rounded to bf16 once (more accurate than the reference's bf16 steps).  q goes to the q
output; k and v go straight into kv_cache[0 / 1] at slot_mapping[t] (skipped when -1).
"""
import torch  # before tvm, so TVM's CUDA runtime finds the already-loaded CUDA libraries

import tvm
from tvm.script import tirx as T

D = 128
WARPS = 4


def _make(H: int, KV: int, BS: int, RH: int, EPS: float):
    TOT = H + 2 * KV
    C = TOT * D

    @T.prim_func
    def qk_norm_rope_kv(qkv_h: T.handle, pos_h: T.handle, qw_h: T.handle, kw_h: T.handle, cs_h: T.handle,
                        slot_h: T.handle, cache_h: T.handle, q_h: T.handle):
        ntok = T.int32()
        mp = T.int32()
        rows = T.int32()
        QKV = T.match_buffer(qkv_h, (ntok, C), "bfloat16", align=16)
        POS = T.match_buffer(pos_h, (ntok,), "int64")
        QW = T.match_buffer(qw_h, (D,), "bfloat16", align=16)
        KW = T.match_buffer(kw_h, (D,), "bfloat16", align=16)
        CS = T.match_buffer(cs_h, (mp, 2 * RH), "bfloat16", align=16)
        SLOT = T.match_buffer(slot_h, (ntok,), "int64")
        CACHE = T.match_buffer(cache_h, (rows, D), "bfloat16", align=16)
        QO = T.match_buffer(q_h, (ntok * H, D), "bfloat16", align=16)
        T.device_entry()
        t, hb = T.cta_id([ntok, (TOT + WARPS - 1) // WARPS])
        tx = T.thread_id([32 * WARPS])
        xr = T.alloc_local((4,), "bfloat16")
        wr = T.alloc_local((4,), "bfloat16")
        v = T.alloc_local((4,), "float32")
        yr = T.alloc_local((4,), "bfloat16")
        acc = T.alloc_local((1,), "float32")
        lane: T.let = tx % 32
        hh: T.let = hb * WARPS + tx // 32
        if hh < TOT:
            T.tile.copy(xr[:], QKV[t, hh * D + lane * 4:hh * D + lane * 4 + 4])
            slot: T.let = SLOT[t]
            if hh < H + KV:
                if hh < H:
                    T.tile.copy(wr[:], QW[lane * 4:lane * 4 + 4])
                else:
                    T.tile.copy(wr[:], KW[lane * 4:lane * 4 + 4])
                acc[0] = T.float32(0)
                for e in T.unroll(4):
                    acc[0] = acc[0] + T.Cast("float32", xr[e]) * T.Cast("float32", xr[e])
                ss: T.float32 = T.cuda.warp_sum(acc[0])
                inv: T.float32 = T.rsqrt(ss / T.float32(D) + T.float32(EPS))
                for e in T.unroll(4):
                    v[e] = T.Cast("float32", xr[e]) * inv * T.Cast("float32", wr[e])
                p: T.let = T.Cast("int32", POS[t])
                for e in T.unroll(4):
                    other: T.float32 = T.tvm_warp_shuffle_xor(T.uint32(0xFFFFFFFF), v[e], RH // 4, 32, 32)
                    d = T.meta_var(lane * 4 + e)
                    if d < RH:
                        yr[e] = T.Cast("bfloat16", v[e] * T.Cast("float32", CS[p, d])
                                       - other * T.Cast("float32", CS[p, RH + d]))
                    elif d < 2 * RH:
                        yr[e] = T.Cast("bfloat16", v[e] * T.Cast("float32", CS[p, d - RH])
                                       + other * T.Cast("float32", CS[p, d]))
                    else:
                        yr[e] = T.Cast("bfloat16", v[e])
                if hh < H:
                    T.tile.copy(QO[t * H + hh, lane * 4:lane * 4 + 4], yr[:])
                elif slot >= T.int64(0):  # cache [2, blocks, BS, KV, D] as rows: k at slot * KV + head
                    row: T.let = T.Cast("int32", slot) * KV + (hh - H)
                    T.tile.copy(CACHE[row, lane * 4:lane * 4 + 4], yr[:])
            elif slot >= T.int64(0):  # v rows follow the k half of the cache
                row: T.let = rows // 2 + T.Cast("int32", slot) * KV + (hh - H - KV)
                T.tile.copy(CACHE[row, lane * 4:lane * 4 + 4], xr[:])

    return qk_norm_rope_kv


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _build(func, arch):
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    with target:
        return tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")


def _shape_key(qkv, cos_sin_cache, kv_cache, eps):
    _, _, block_size, kv_heads, head_dim = kv_cache.shape
    assert head_dim == D
    heads = qkv.shape[1] // head_dim - 2 * kv_heads
    return heads, kv_heads, block_size, cos_sin_cache.shape[1] // 2, float(eps)


def _prepare(qkv, positions, q_norm_weight, k_norm_weight, cos_sin_cache, slot_mapping, kv_cache, eps, arch=None):
    key = _shape_key(qkv, cos_sin_cache, kv_cache, eps)
    if key not in _COMPILED:
        assert key[3] % 4 == 0 and 2 * key[3] <= D
        _COMPILED[key] = _build(_make(*key), arch or _arch())
    return [_COMPILED[key]]


def solve(qkv, positions, q_norm_weight, k_norm_weight, cos_sin_cache, slot_mapping, kv_cache, eps):
    (exe,) = _prepare(qkv, positions, q_norm_weight, k_norm_weight, cos_sin_cache, slot_mapping, kv_cache, eps)
    heads = _shape_key(qkv, cos_sin_cache, kv_cache, eps)[0]
    tokens = qkv.shape[0]
    q = torch.empty(tokens, heads, D, dtype=qkv.dtype, device=qkv.device)
    exe(qkv.contiguous(), positions.contiguous(), q_norm_weight.contiguous(), k_norm_weight.contiguous(),
        cos_sin_cache.contiguous(), slot_mapping.contiguous(), kv_cache.view(-1, D), q.view(-1, D))
    return q
