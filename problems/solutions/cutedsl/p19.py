"""p19 GLM-4.5 q/k RMSNorm + partial NeoX RoPE + paged KV write (in place), in CuTe DSL.

One fused kernel: a warp per (token, head) over the fused qkv row (q heads, then k heads, then v
heads); each lane holds 4 of the 128 dims (one 8-byte load).  q/k heads: RMSNorm (warp shuffle
sum, fp32), weight, NeoX rotation of the first 64 dims with the bf16 cos/sin table (partner dims
i, i+32 sit in lanes l, l^8), rounded to bf16 once (more accurate than the reference's bf16 steps).
q goes to the q output; k and v go straight into kv_cache[0 / 1] at slot_mapping[t] (skipped when -1).
"""
import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

HEAD_DIM = 128
WARPS = 4


class QKNormRopeKV:
    def __init__(self, heads: int, kv_heads: int, block_size: int, rot_half: int, eps: float):
        self.H, self.KV, self.BS, self.RH, self.eps = heads, kv_heads, block_size, rot_half, eps
        self.total = heads + 2 * kv_heads

    @cute.jit
    def __call__(self, qkv: cute.Tensor, pos: cute.Tensor, qw: cute.Tensor, kw: cute.Tensor,
                 cs: cute.Tensor, slots: cute.Tensor, cache: cute.Tensor, qout: cute.Tensor, stream):
        grid = [qkv.shape[0], (self.total + WARPS - 1) // WARPS, 1]
        self.kernel(qkv, pos, qw, kw, cs, slots, cache, qout).launch(grid=grid, block=[32 * WARPS, 1, 1],
                                                                     stream=stream)

    @cute.kernel
    def kernel(self, qkv: cute.Tensor, pos: cute.Tensor, qw: cute.Tensor, kw: cute.Tensor,
               cs: cute.Tensor, slots: cute.Tensor, cache: cute.Tensor, qout: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        t, hb, _ = cute.arch.block_idx()
        warp = tidx // 32
        lane = tidx % 32
        hh = hb * WARPS + warp
        if hh < self.total:
            xin = cute.zipped_divide(qkv[t, None], (4,))[None, hh * (HEAD_DIM // 4) + lane]
            rx = cute.make_rmem_tensor((4,), qkv.element_type)
            cute.autovec_copy(xin, rx)
            x = rx.load().to(Float32)
            slot = slots[t]
            if hh < self.H + self.KV:
                rq = cute.make_rmem_tensor((4,), qw.element_type)
                cute.autovec_copy(cute.zipped_divide(qw, (4,))[None, lane], rq)
                rk = cute.make_rmem_tensor((4,), kw.element_type)
                cute.autovec_copy(cute.zipped_divide(kw, (4,))[None, lane], rk)
                ss = (x * x).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
                ss = cute.arch.warp_reduction_sum(ss)
                inv = cute.math.rsqrt(ss / HEAD_DIM + self.eps)
                v = cute.make_rmem_tensor((4,), Float32)
                is_q = hh < self.H
                for e in cutlass.range_constexpr(4):
                    w = rk[e].to(Float32)
                    if is_q:
                        w = rq[e].to(Float32)
                    v[e] = x[e] * inv * w
                # NeoX rotate-half on dims [0, 2*RH): partner of dim d is d^RH, held by lane^(RH/4)
                p = Int32(pos[t])
                y = cute.make_rmem_tensor((4,), Float32)
                for e in cutlass.range_constexpr(4):
                    other = cute.arch.shuffle_sync_bfly(v[e], offset=self.RH // 4)
                    d = lane * 4 + e
                    y[e] = v[e]
                    if d < self.RH:
                        y[e] = v[e] * Float32(cs[p, d]) - other * Float32(cs[p, self.RH + d])
                    elif d < 2 * self.RH:
                        y[e] = v[e] * Float32(cs[p, d - self.RH]) + other * Float32(cs[p, d])
                ry = cute.make_rmem_tensor((4,), qkv.element_type)
                ry.store(y.load().to(qkv.element_type))
                if is_q:
                    cute.autovec_copy(ry, cute.zipped_divide(qout[t * self.H + hh, None], (4,))[None, lane])
                elif slot >= 0:  # cache [2, blocks, BS, KV, D] as rows: k at slot * KV + head
                    row = Int32(slot) * self.KV + (hh - self.H)
                    cute.autovec_copy(ry, cute.zipped_divide(cache[row, None], (4,))[None, lane])
            elif slot >= 0:  # v rows follow the k half of the cache
                row = cache.shape[0] // 2 + Int32(slot) * self.KV + (hh - self.H - self.KV)
                cute.autovec_copy(rx, cute.zipped_divide(cache[row, None], (4,))[None, lane])


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _shape_key(qkv, cos_sin_cache, kv_cache, eps):
    _, _, block_size, kv_heads, head_dim = kv_cache.shape
    assert head_dim == HEAD_DIM
    heads = qkv.shape[1] // head_dim - 2 * kv_heads
    return heads, kv_heads, block_size, cos_sin_cache.shape[1] // 2, float(eps)


def _prepare(qkv, positions, q_norm_weight, k_norm_weight, cos_sin_cache, slot_mapping, kv_cache, eps, arch=None):
    key = _shape_key(qkv, cos_sin_cache, kv_cache, eps)
    if key not in _COMPILED:
        heads, kv_heads, block_size, rot_half, _ = key
        assert rot_half % 4 == 0 and 2 * rot_half <= HEAD_DIM
        bf = cutlass.BFloat16
        t, rows, mp, qrows = cute.sym_int(), cute.sym_int(), cute.sym_int(), cute.sym_int()
        C = (heads + 2 * kv_heads) * HEAD_DIM
        args = [make_fake_compact_tensor(bf, (t, C), stride_order=(1, 0), assumed_align=16),
                make_fake_compact_tensor(cutlass.Int64, (t,)),
                make_fake_compact_tensor(bf, (HEAD_DIM,), assumed_align=16),
                make_fake_compact_tensor(bf, (HEAD_DIM,), assumed_align=16),
                make_fake_compact_tensor(bf, (mp, 2 * rot_half), stride_order=(1, 0), assumed_align=16),
                make_fake_compact_tensor(cutlass.Int64, (t,)),
                make_fake_compact_tensor(bf, (rows, HEAD_DIM), stride_order=(1, 0), assumed_align=16),
                make_fake_compact_tensor(bf, (qrows, HEAD_DIM), stride_order=(1, 0), assumed_align=16),
                make_fake_stream(use_tvm_ffi_env_stream=True)]
        _COMPILED[key] = cute.compile(QKNormRopeKV(*key), *args,
                                      options=f"--gpu-arch {arch or _arch()} --enable-tvm-ffi")
    return [_COMPILED[key]]


def solve(qkv, positions, q_norm_weight, k_norm_weight, cos_sin_cache, slot_mapping, kv_cache, eps):
    (fn,) = _prepare(qkv, positions, q_norm_weight, k_norm_weight, cos_sin_cache, slot_mapping, kv_cache, eps)
    heads = _shape_key(qkv, cos_sin_cache, kv_cache, eps)[0]
    tokens = qkv.shape[0]
    q = torch.empty(tokens, heads, HEAD_DIM, dtype=qkv.dtype, device=qkv.device)
    fn(qkv.contiguous(), positions.contiguous(), q_norm_weight.contiguous(), k_norm_weight.contiguous(),
       cos_sin_cache.contiguous(), slot_mapping.contiguous(), kv_cache.view(-1, HEAD_DIM),
       q.view(-1, HEAD_DIM))
    return q
