"""p21 per-(token, head) dynamic FP8 quantization + paged KV-cache append (in place) in TIRx.

One CTA per token (skipped when its slot is -1), 16 lanes per head: each lane loads 8 bf16 of key
and of value (128-bit accesses), the row's absmax is reduced over the head's 16 lanes with butterfly
shuffles, and scale = max(absmax / 448, 1e-6), inv = 1 / scale give the e4m3 codes of
clamp(x * inv, -448, 448) (round to nearest even).  The two divisions are done in fp64 and rounded
to fp32 once, which equals the correctly rounded fp32 division the reference does (fast math would
make them approximate).  Codes go straight into the uint8 caches at slot * heads + head, the scale
beside them.
"""
import torch  # before tvm, so TVM's CUDA runtime finds the already-loaded CUDA libraries

import tvm
from tvm.script import tirx as T

VEC = 8
FP8_MAX = 448.0
MIN_SCALE = 1e-6


def _make(H: int, D: int):
    LANES = D // VEC
    THREADS = H * LANES
    STEPS = LANES.bit_length() - 1

    @T.prim_func
    def quantize_append(k_h: T.handle, v_h: T.handle, s_h: T.handle, kc_h: T.handle, vc_h: T.handle,
                        ks_h: T.handle, vs_h: T.handle):
        ntok = T.int32()
        rows = T.int32()
        K = T.match_buffer(k_h, (ntok, H * D), "bfloat16", align=16)
        V = T.match_buffer(v_h, (ntok, H * D), "bfloat16", align=16)
        SLOT = T.match_buffer(s_h, (ntok,), "int64")
        KC = T.match_buffer(kc_h, (rows, D), "uint8", align=16)
        VC = T.match_buffer(vc_h, (rows, D), "uint8", align=16)
        KS = T.match_buffer(ks_h, (rows,), "float32")
        VS = T.match_buffer(vs_h, (rows,), "float32")
        T.device_entry()
        t = T.cta_id([ntok])
        tx = T.thread_id([THREADS])
        KC8 = T.decl_buffer((rows, D), "float8_e4m3fn", data=KC.data)    # the same bytes, as e4m3
        VC8 = T.decl_buffer((rows, D), "float8_e4m3fn", data=VC.data)
        xr = T.alloc_local((VEC,), "bfloat16")
        qr = T.alloc_local((VEC,), "float8_e4m3fn")
        amax = T.alloc_local((1,), "float32")
        sc = T.alloc_local((2,), "float32")       # scale, 1 / scale
        slot: T.let = SLOT[t]
        if slot >= T.int64(0):                    # the same for the whole CTA: no divergent shuffles
            row: T.let = T.Cast("int32", slot) * H + tx // LANES
            col = T.meta_var((tx % LANES) * VEC)
            for which in T.unroll(2):
                if which == 0:
                    T.tile.copy(xr[:], K[t, tx * VEC:tx * VEC + VEC])
                else:
                    T.tile.copy(xr[:], V[t, tx * VEC:tx * VEC + VEC])
                amax[0] = T.float32(0)
                for e in T.unroll(VEC):
                    amax[0] = T.max(amax[0], T.max(T.Cast("float32", xr[e]), -T.Cast("float32", xr[e])))
                for k in T.unroll(STEPS):
                    amax[0] = T.max(amax[0], T.tvm_warp_shuffle_xor(T.uint32(0xFFFFFFFF), amax[0],
                                                                    (LANES // 2) >> k, 32, 32))
                sc[0] = T.max(T.Cast("float32", T.Cast("float64", amax[0]) / T.float64(FP8_MAX)),
                              T.float32(MIN_SCALE))
                sc[1] = T.Cast("float32", T.float64(1) / T.Cast("float64", sc[0]))
                for e in T.unroll(VEC):
                    y = T.meta_var(T.Cast("float32", xr[e]) * sc[1])
                    qr[e] = T.Cast("float8_e4m3fn", T.min(T.max(y, T.float32(-FP8_MAX)), T.float32(FP8_MAX)))
                if which == 0:
                    T.tile.copy(KC8[row, col:col + VEC], qr[:])
                    if tx % LANES == 0:
                        KS[row] = sc[0]
                else:
                    T.tile.copy(VC8[row, col:col + VEC], qr[:])
                    if tx % LANES == 0:
                        VS[row] = sc[0]

    return quantize_append


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _build(func, arch):
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    with target:
        return tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")


def _prepare(key, value, slot_mapping, key_cache, value_cache, k_scale_cache, v_scale_cache, arch=None):
    _, heads, head_dim = key.shape
    k = (heads, head_dim)
    if k not in _COMPILED:
        lanes = head_dim // VEC
        assert head_dim % VEC == 0 and lanes <= 32 and lanes & (lanes - 1) == 0 and heads * lanes <= 1024, key.shape
        _COMPILED[k] = _build(_make(*k), arch or _arch())
    return [_COMPILED[k]]


def solve(key, value, slot_mapping, key_cache, value_cache, k_scale_cache, v_scale_cache):
    (exe,) = _prepare(key, value, slot_mapping, key_cache, value_cache, k_scale_cache, v_scale_cache)
    tokens, heads, head_dim = key.shape
    if tokens == 0:
        return None
    rows = lambda c: c.view(-1, head_dim)  # noqa: E731  (zero-copy views of the caches: written in place)
    exe(key.contiguous().view(tokens, -1), value.contiguous().view(tokens, -1), slot_mapping.contiguous(),
        rows(key_cache), rows(value_cache), k_scale_cache.view(-1), v_scale_cache.view(-1))
    return None
