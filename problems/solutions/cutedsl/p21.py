"""p21 per-(token, head) dynamic FP8 quantization + paged KV-cache append (in place) in CuTe DSL.

One CTA per token (skipped when its slot is -1), 16 lanes per head: each lane loads 8 bf16 of key
and of value (128-bit accesses), the row's absmax is reduced over the head's 16 lanes with butterfly
shuffles, and scale = max(absmax / 448, 1e-6), inv = 1 / scale (IEEE fp32 division, as the
reference rounds them) give the e4m3 codes of clamp(x * inv, -448, 448) (round to nearest even).
Codes go straight into the uint8 caches at slot * heads + head, the scale beside them.
"""
import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

VEC = 8                # 8 x bf16 = one 128-bit load; 8 e4m3 codes = one 64-bit store
FP8_MAX = 448.0
MIN_SCALE = 1e-6


class QuantizeAppend:
    def __init__(self, heads: int, head_dim: int):
        self.H, self.D = heads, head_dim
        self.lanes = head_dim // VEC
        self.threads = heads * self.lanes

    @cute.jit
    def __call__(self, key: cute.Tensor, value: cute.Tensor, slots: cute.Tensor, kc: cute.Tensor,
                 vc: cute.Tensor, ks: cute.Tensor, vs: cute.Tensor, stream):
        kc8 = cute.recast_tensor(kc, cutlass.Float8E4M3FN)     # the uint8 caches seen as e4m3
        vc8 = cute.recast_tensor(vc, cutlass.Float8E4M3FN)
        self.kernel(key, value, slots, kc8, vc8, ks, vs).launch(grid=[key.shape[0], 1, 1],
                                                                 block=[self.threads, 1, 1], stream=stream)

    @cute.jit
    def quantize(self, src: cute.Tensor, codes: cute.Tensor, scales: cute.Tensor, t: Int32, row: Int32,
                 tidx: Int32):
        j = tidx % self.lanes
        rx = cute.make_rmem_tensor((VEC,), src.element_type)
        cute.autovec_copy(cute.zipped_divide(src[t, None], (VEC,))[None, tidx], rx)
        amax = Float32(0.0)
        for e in cutlass.range_constexpr(VEC):
            v = Float32(rx[e])
            amax = cute.arch.fmax(amax, cute.arch.fmax(v, -v))
        for k in cutlass.range_constexpr(self.lanes.bit_length() - 1):
            amax = cute.arch.fmax(amax, cute.arch.shuffle_sync_bfly(amax, offset=(self.lanes // 2) >> k))
        scale = cute.arch.fmax(amax / Float32(FP8_MAX), Float32(MIN_SCALE))
        inv = Float32(1.0) / scale
        y = rx.load().to(Float32) * inv
        y = cute.where(y > FP8_MAX, cute.full_like(y, FP8_MAX), y)
        y = cute.where(y < -FP8_MAX, cute.full_like(y, -FP8_MAX), y)
        rq = cute.make_rmem_tensor((VEC,), cutlass.Float8E4M3FN)
        rq.store(y.to(cutlass.Float8E4M3FN))                  # round to nearest even
        cute.autovec_copy(rq, cute.zipped_divide(codes[row, None], (VEC,))[None, j])
        if j == 0:
            scales[row] = scale

    @cute.kernel
    def kernel(self, key: cute.Tensor, value: cute.Tensor, slots: cute.Tensor, kc8: cute.Tensor,
               vc8: cute.Tensor, ks: cute.Tensor, vs: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        t, _, _ = cute.arch.block_idx()
        slot = slots[t]
        if slot >= 0:                            # the same for the whole CTA: no divergent shuffles
            row = Int32(slot) * self.H + tidx // self.lanes
            self.quantize(key, kc8, ks, t, row, tidx)
            self.quantize(value, vc8, vs, t, row, tidx)


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _prepare(key, value, slot_mapping, key_cache, value_cache, k_scale_cache, v_scale_cache, arch=None):
    _, heads, head_dim = key.shape
    k = (heads, head_dim)
    if k not in _COMPILED:
        lanes = head_dim // VEC
        assert head_dim % VEC == 0 and lanes <= 32 and lanes & (lanes - 1) == 0 and heads * lanes <= 1024, key.shape
        t, rows = cute.sym_int(), cute.sym_int()
        fx = make_fake_compact_tensor(cutlass.BFloat16, (t, heads * head_dim), stride_order=(1, 0), assumed_align=16)
        fslot = make_fake_compact_tensor(cutlass.Int64, (t,))
        fc = make_fake_compact_tensor(cutlass.Uint8, (rows, head_dim), stride_order=(1, 0), assumed_align=16)
        fsc = make_fake_compact_tensor(cutlass.Float32, (rows,))
        _COMPILED[k] = cute.compile(QuantizeAppend(*k), fx, fx, fslot, fc, fc, fsc, fsc,
                                    make_fake_stream(use_tvm_ffi_env_stream=True),
                                    options=f"--gpu-arch {arch or _arch()} --enable-tvm-ffi")
    return [_COMPILED[k]]


def solve(key, value, slot_mapping, key_cache, value_cache, k_scale_cache, v_scale_cache):
    (fn,) = _prepare(key, value, slot_mapping, key_cache, value_cache, k_scale_cache, v_scale_cache)
    tokens, heads, head_dim = key.shape
    if tokens == 0:
        return None
    rows = lambda c: c.view(-1, head_dim)  # noqa: E731  (zero-copy views of the caches: written in place)
    fn(key.contiguous().view(tokens, -1), value.contiguous().view(tokens, -1), slot_mapping.contiguous(),
       rows(key_cache), rows(value_cache), k_scale_cache.view(-1), v_scale_cache.view(-1))
    return None
