"""p22 MiniMax-M3 per-head Gemma RMSNorm + partial NeoX RoPE + dual paged-cache insert, in CuTe DSL.

One fused kernel: a warp per (token, head) of the fused row [q 16 | k 4 | v 4 | index_q 4 | index_k 1]
x 128; each lane holds 4 of the 128 dims (one 8-byte load).  Normed heads: sum of squares by warp
shuffles (fp32), x * rsqrt(mean + eps) * (1 + w) rounded to bf16 (as the reference rounds), then
the NeoX rotation of the first 64 dims in fp32 on those rounded values (partner dims i, i + 32 sit
in lanes l, l ^ 8), rounded to bf16.  q and index_q go to the outputs; k and v go straight into
kv_cache[block, head, offset, 0:128 / 128:256] and index_k into index_cache[block, offset] (in place).
"""
import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

HEAD_DIM = 128
HEADS, KV_HEADS, INDEX_HEADS = 16, 4, 4
TOTAL = HEADS + 2 * KV_HEADS + INDEX_HEADS + 1     # 29 head rows per token
EPS = 1e-6
WARPS = 4


class NormRopeDualInsert:
    def __init__(self, block_size: int, rot_half: int):
        self.BS, self.RH = block_size, rot_half

    @cute.jit
    def __call__(self, qkv: cute.Tensor, qw: cute.Tensor, kw: cute.Tensor, iqw: cute.Tensor, ikw: cute.Tensor,
                 pos: cute.Tensor, cs: cute.Tensor, slots: cute.Tensor, islots: cute.Tensor,
                 kv: cute.Tensor, idx: cute.Tensor, qout: cute.Tensor, iqout: cute.Tensor, stream):
        grid = [qkv.shape[0], (TOTAL + WARPS - 1) // WARPS, 1]
        self.kernel(qkv, qw, kw, iqw, ikw, pos, cs, slots, islots, kv, idx, qout, iqout).launch(
            grid=grid, block=[32 * WARPS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, qkv: cute.Tensor, qw: cute.Tensor, kw: cute.Tensor, iqw: cute.Tensor, ikw: cute.Tensor,
               pos: cute.Tensor, cs: cute.Tensor, slots: cute.Tensor, islots: cute.Tensor,
               kv: cute.Tensor, idx: cute.Tensor, qout: cute.Tensor, iqout: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        t, hb, _ = cute.arch.block_idx()
        lane = tidx % 32
        hh = hb * WARPS + tidx // 32
        if hh < TOTAL:                                  # the 3 spare warps of the last CTA leave together
            rx = cute.make_rmem_tensor((4,), qkv.element_type)
            cute.autovec_copy(cute.zipped_divide(qkv[t, None], (4,))[None, hh * (HEAD_DIM // 4) + lane], rx)
            if hh >= HEADS + KV_HEADS and hh < HEADS + 2 * KV_HEADS:
                slot = Int32(slots[t])                  # v: copied unchanged into the cache
                if slot >= 0:
                    row = (((slot // self.BS) * KV_HEADS + hh - HEADS - KV_HEADS) * self.BS + slot % self.BS) * 2 + 1
                    cute.autovec_copy(rx, cute.zipped_divide(kv[row, None], (4,))[None, lane])
            else:
                rw = cute.make_rmem_tensor((4,), qw.element_type)
                if hh < HEADS:
                    cute.autovec_copy(cute.zipped_divide(qw, (4,))[None, lane], rw)
                elif hh < HEADS + KV_HEADS:
                    cute.autovec_copy(cute.zipped_divide(kw, (4,))[None, lane], rw)
                elif hh < TOTAL - 1:
                    cute.autovec_copy(cute.zipped_divide(iqw, (4,))[None, lane], rw)
                else:
                    cute.autovec_copy(cute.zipped_divide(ikw, (4,))[None, lane], rw)
                x = rx.load().to(Float32)
                ss = cute.arch.warp_reduction_sum((x * x).reduce(cute.ReductionOp.ADD, Float32(0.0), 0))
                inv = cute.math.rsqrt(ss / HEAD_DIM + EPS)
                nb = cute.make_rmem_tensor((4,), qkv.element_type)   # the normed head, rounded to bf16
                nf = cute.make_rmem_tensor((4,), Float32)
                for e in cutlass.range_constexpr(4):
                    nf[e] = x[e] * inv * (Float32(1.0) + rw[e].to(Float32))
                nb.store(nf.load().to(qkv.element_type))
                n = nb.load().to(Float32)
                p = Int32(pos[t])
                y = cute.make_rmem_tensor((4,), Float32)
                for e in cutlass.range_constexpr(4):
                    other = cute.arch.shuffle_sync_bfly(n[e], offset=self.RH // 4)
                    d = lane * 4 + e
                    y[e] = n[e]
                    if d < self.RH:
                        y[e] = n[e] * Float32(cs[p, d]) - other * Float32(cs[p, self.RH + d])
                    elif d < 2 * self.RH:
                        y[e] = n[e] * Float32(cs[p, d - self.RH]) + other * Float32(cs[p, d])
                ry = cute.make_rmem_tensor((4,), qkv.element_type)
                ry.store(y.load().to(qkv.element_type))
                if hh < HEADS:
                    cute.autovec_copy(ry, cute.zipped_divide(qout[t * HEADS + hh, None], (4,))[None, lane])
                elif hh < HEADS + KV_HEADS:
                    slot = Int32(slots[t])
                    if slot >= 0:
                        row = (((slot // self.BS) * KV_HEADS + hh - HEADS) * self.BS + slot % self.BS) * 2
                        cute.autovec_copy(ry, cute.zipped_divide(kv[row, None], (4,))[None, lane])
                elif hh < TOTAL - 1:
                    r = t * INDEX_HEADS + hh - HEADS - 2 * KV_HEADS
                    cute.autovec_copy(ry, cute.zipped_divide(iqout[r, None], (4,))[None, lane])
                else:
                    islot = Int32(islots[t])            # index_cache [blocks, BS, 128] rows are slots
                    if islot >= 0:
                        cute.autovec_copy(ry, cute.zipped_divide(idx[islot, None], (4,))[None, lane])


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _shape_key(qkv, cos_sin_cache, kv_cache):
    _, kv_heads, block_size, width = kv_cache.shape
    assert (kv_heads, width, qkv.shape[1]) == (KV_HEADS, 2 * HEAD_DIM, TOTAL * HEAD_DIM)
    return block_size, cos_sin_cache.shape[1] // 2


def _prepare(qkv, q_norm_weight, k_norm_weight, index_q_norm_weight, index_k_norm_weight, positions,
             cos_sin_cache, slot_mapping, index_slot_mapping, kv_cache, index_cache, arch=None):
    key = _shape_key(qkv, cos_sin_cache, kv_cache)
    if key not in _COMPILED:
        _, rot_half = key
        assert rot_half % 4 == 0 and 2 * rot_half <= HEAD_DIM
        bf = cutlass.BFloat16
        t = cute.sym_int()

        def rows():
            return make_fake_compact_tensor(bf, (cute.sym_int(), HEAD_DIM), stride_order=(1, 0), assumed_align=16)

        w = make_fake_compact_tensor(bf, (HEAD_DIM,), assumed_align=16)
        args = [make_fake_compact_tensor(bf, (t, TOTAL * HEAD_DIM), stride_order=(1, 0), assumed_align=16),
                w, w, w, w,
                make_fake_compact_tensor(cutlass.Int64, (t,)),
                make_fake_compact_tensor(bf, (cute.sym_int(), 2 * rot_half), stride_order=(1, 0), assumed_align=16),
                make_fake_compact_tensor(cutlass.Int64, (t,)),
                make_fake_compact_tensor(cutlass.Int64, (t,)),
                rows(), rows(), rows(), rows(),
                make_fake_stream(use_tvm_ffi_env_stream=True)]
        _COMPILED[key] = cute.compile(NormRopeDualInsert(*key), *args,
                                      options=f"--gpu-arch {arch or _arch()} --enable-tvm-ffi")
    return [_COMPILED[key]]


def solve(qkv, q_norm_weight, k_norm_weight, index_q_norm_weight, index_k_norm_weight, positions,
          cos_sin_cache, slot_mapping, index_slot_mapping, kv_cache, index_cache):
    (fn,) = _prepare(qkv, q_norm_weight, k_norm_weight, index_q_norm_weight, index_k_norm_weight, positions,
                     cos_sin_cache, slot_mapping, index_slot_mapping, kv_cache, index_cache)
    tokens = qkv.shape[0]
    q = torch.empty(tokens, HEADS, HEAD_DIM, dtype=qkv.dtype, device=qkv.device)
    index_q = torch.empty(tokens, INDEX_HEADS, HEAD_DIM, dtype=qkv.dtype, device=qkv.device)
    fn(qkv.contiguous(), q_norm_weight.contiguous(), k_norm_weight.contiguous(),
       index_q_norm_weight.contiguous(), index_k_norm_weight.contiguous(), positions.contiguous(),
       cos_sin_cache.contiguous(), slot_mapping.contiguous(), index_slot_mapping.contiguous(),
       kv_cache.view(-1, HEAD_DIM), index_cache.view(-1, HEAD_DIM), q.view(-1, HEAD_DIM), index_q.view(-1, HEAD_DIM))
    return q, index_q
