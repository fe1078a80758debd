"""p19 GLM-4.5 q/k RMSNorm + partial NeoX RoPE + paged KV write (in place), in TIRx.

One fused kernel, memory-bound (~50 MB per call), written for bytes in flight: a half-warp per
(token, head) with 8 of the 128 dims a lane (one 16-byte load), and each half-warp takes 6 heads of one
token (KV units per token: unit u takes heads u, u + KV, ..., i.e. H / KV q heads, one k and one v head),
issuing all six 16-byte loads (plus cos/sin and the weights, 16 bytes each) before any arithmetic.
A CTA of 256 threads covers 16 / KV tokens (2 at full scale): 1024 CTAs, ~24 KiB of loads each.
The shipped kernel (a warp per head, 8-byte loads, 4 heads a CTA) kept ~16 KiB in flight per SM.

Arithmetic as the shipped kernel (which passed at ~0.11 of the allowance on the H200): RMSNorm in fp32
(a 16-lane butterfly sum of squares), times the weight in fp32, NeoX rotation of the first 2 * RH dims
in fp32 with the bf16 cos/sin table (partner dims d, d + RH sit in lanes l, l ^ (RH / 8)), one rounding
to bf16; each lane folds its rotation case into (c, -s), (c, s) or (1, 0) once, so every element is one
multiply and one FMA with no branch (an if/elif per element compiled to divergent branches). q goes to the q output, k and v straight into kv_cache[0 / 1] at slot_mapping[t] (skipped
when -1). Rows past the last token clamp their loads and skip their stores (no shuffle is skipped).
"""
import torch  # before tvm, so TVM's CUDA runtime finds the already-loaded CUDA libraries

import tvm
from tvm.script import tirx as T

D = 128
VEC = 8                    # bf16 per lane per head: one 16-byte access
LANES = D // VEC           # 16 lanes per head
THREADS = 256
UNITS = THREADS // LANES   # 16 half-warps per CTA
FULL = T.uint32(0xFFFFFFFF)


def _make(H: int, KV: int, BS: int, RH: int, EPS: float):
    assert H % KV == 0 and UNITS % KV == 0 and RH % VEC == 0 and 2 * RH <= D and RH // VEC < LANES
    TOT = H + 2 * KV
    C = TOT * D
    QPER = H // KV             # q heads per unit
    NH = QPER + 2              # heads per unit: q..., k, v
    TPC = UNITS // KV          # tokens per CTA
    RL = RH // VEC             # lanes holding the first rotated half

    @T.prim_func
    def qk_norm_rope_kv(qkv_h: T.handle, pos_h: T.handle, qw_h: T.handle, kw_h: T.handle, cs_h: T.handle,
                        slot_h: T.handle, cache_h: T.handle, q_h: T.handle):
        ntok = T.int32()
        mp = T.int32()
        nb = T.int32()
        QKV = T.match_buffer(qkv_h, (ntok, C), "bfloat16", align=16)
        POS = T.match_buffer(pos_h, (ntok,), "int64")
        QW = T.match_buffer(qw_h, (D,), "bfloat16", align=16)
        KW = T.match_buffer(kw_h, (D,), "bfloat16", align=16)
        CS = T.match_buffer(cs_h, (mp, 2 * RH), "bfloat16", align=16)
        SLOT = T.match_buffer(slot_h, (ntok,), "int64")
        CACHE5 = T.match_buffer(cache_h, (2, nb, BS, KV, D), "bfloat16", align=16)
        Q3 = T.match_buffer(q_h, (ntok, H, D), "bfloat16", align=16)
        T.device_entry()
        bid = T.cta_id([T.ceildiv(ntok, TPC)])
        tx = T.thread_id([THREADS])
        CACHE = T.decl_buffer((2 * nb * BS * KV, D), "bfloat16", data=CACHE5.data)
        QO = T.decl_buffer((ntok * H, D), "bfloat16", data=Q3.data)
        x = T.alloc_local((NH * VEC,), "bfloat16")
        rq = T.alloc_local((VEC,), "bfloat16")
        rk = T.alloc_local((VEC,), "bfloat16")
        rc = T.alloc_local((VEC,), "bfloat16")
        rs = T.alloc_local((VEC,), "bfloat16")
        cf = T.alloc_local((VEC,), "float32")
        sf = T.alloc_local((VEC,), "float32")
        v = T.alloc_local((VEC,), "float32")
        y = T.alloc_local((VEC,), "bfloat16")
        acc = T.alloc_local((1,), "float32")
        idx = T.alloc_local((3,), "int32")              # token (clamped), position, slot
        unit = T.meta_var(tx // LANES)
        l = T.meta_var(tx % LANES)
        u = T.meta_var(unit % KV)
        t_raw = T.meta_var(bid * TPC + unit // KV)
        idx[0] = T.min(t_raw, ntok - 1)
        for i in T.unroll(NH):                           # all heads' loads first
            c0 = T.meta_var((u + i * KV) * D + l * VEC)
            T.tile.copy(x[i * VEC:(i + 1) * VEC], QKV[idx[0], c0:c0 + VEC])
        T.tile.copy(rq[:], QW[l * VEC:(l + 1) * VEC])
        T.tile.copy(rk[:], KW[l * VEC:(l + 1) * VEC])
        idx[1] = T.Cast("int32", POS[idx[0]])
        idx[2] = T.Cast("int32", SLOT[idx[0]])
        ci = T.meta_var((l % RL) * VEC)                  # lanes past 2 * RL load an unused copy
        T.tile.copy(rc[:], CS[idx[1], ci:ci + VEC])
        T.tile.copy(rs[:], CS[idx[1], RH + ci:RH + ci + VEC])
        for e in T.unroll(VEC):                          # per lane, once: lanes < RL take (c, -s), lanes
            cf[e] = T.Select(l < 2 * RL, T.Cast("float32", rc[e]), T.float32(1))      # < 2 RL (c, s),
            sf[e] = T.Select(l < RL, T.float32(-1) * T.Cast("float32", rs[e]),       # others (1, 0)
                             T.Select(l < 2 * RL, T.Cast("float32", rs[e]), T.float32(0)))
        for i in T.unroll(NH - 1):                       # q heads, then the k head
            acc[0] = T.float32(0)
            for e in T.unroll(VEC):
                acc[0] = acc[0] + T.Cast("float32", x[i * VEC + e]) * T.Cast("float32", x[i * VEC + e])
            ss: T.float32 = T.cuda.warp_sum(acc[0], LANES)
            inv: T.float32 = T.rsqrt(ss / T.float32(D) + T.float32(EPS))
            for e in T.unroll(VEC):
                if i < QPER:
                    v[e] = T.Cast("float32", x[i * VEC + e]) * inv * T.Cast("float32", rq[e])
                else:
                    v[e] = T.Cast("float32", x[i * VEC + e]) * inv * T.Cast("float32", rk[e])
            for e in T.unroll(VEC):                      # y = v c + partner s' (no branch, no select)
                other: T.float32 = T.tvm_warp_shuffle_xor(FULL, v[e], RL, 32, 32)
                y[e] = T.Cast("bfloat16", v[e] * cf[e] + other * sf[e])
            if t_raw < ntok:
                if i < QPER:
                    T.tile.copy(QO[idx[0] * H + u + i * KV, l * VEC:(l + 1) * VEC], y[:])
                elif idx[2] >= 0:                        # k rows: slot * KV + head
                    T.tile.copy(CACHE[idx[2] * KV + u, l * VEC:(l + 1) * VEC], y[:])
        if t_raw < ntok and idx[2] >= 0:                 # v rows follow the k half of the cache
            T.tile.copy(CACHE[nb * BS * KV + idx[2] * KV + u, l * VEC:(l + 1) * VEC],
                        x[(NH - 1) * VEC:NH * VEC])

    return qk_norm_rope_kv


_COMPILED = {}
_FAST = {}
"""solve()'s cache: the raw shape numbers it sees -> (the module's main function, q heads), so a warm call
does one dict look-up, one torch.empty and the launch (calling the Executable itself re-walks its module
tree in Executable.jit() on every call: ~5-8 us of Python on the CPU here)."""


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
    assert all(t.is_contiguous() for t in (qkv, positions, q_norm_weight, k_norm_weight, cos_sin_cache,
                                           slot_mapping, kv_cache))
    assert positions.dtype == torch.int64 and slot_mapping.dtype == torch.int64
    if key not in _COMPILED:
        _COMPILED[key] = _build(_make(*key), arch or _arch())
    return [_COMPILED[key]]


def solve(qkv, positions, q_norm_weight, k_norm_weight, cos_sin_cache, slot_mapping, kv_cache, eps):
    key = (qkv.shape[1], kv_cache.shape[2], kv_cache.shape[3], cos_sin_cache.shape[1], eps)
    hit = _FAST.get(key)
    if hit is None:
        (exe,) = _prepare(qkv, positions, q_norm_weight, k_norm_weight, cos_sin_cache, slot_mapping, kv_cache, eps)
        hit = _FAST[key] = (exe["main"], _shape_key(qkv, cos_sin_cache, kv_cache, eps)[0])
    fn, heads = hit
    q = torch.empty(qkv.shape[0], heads, D, dtype=qkv.dtype, device=qkv.device)
    fn(qkv, positions, q_norm_weight, k_norm_weight, cos_sin_cache, slot_mapping, kv_cache, q)
    return q
