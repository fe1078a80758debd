"""CPU replays of the pending kv_cache speed replacements (p19, p25; p20's arithmetic is the shipped one,
replayed by test_mlp_kv_numerics.py), checked against the problems the referee's way.

p25 replays the copy kernels' schedule (chunk, thread, 16-byte vector) and must equal the reference bit for
bit; p19 replays the fused norm/rope kernels' fp32 arithmetic in their order (8 dims a lane summed in
sequence, a 16-lane xor butterfly, x * inv * w, the rotation, one bf16 rounding).
"""

from __future__ import annotations

import pytest
import torch

import numerics

THREADS, VEC_WORDS, UNROLL = 128, 4, 8          # p25: the pending kernels' CTA, vector and unroll


def _p25_kernel(src_k, src_v, dst_k, dst_v, block_mapping):
    nb = src_k.shape[0]
    nvec = src_k[0].numel() // (4 * VEC_WORDS)
    chunks = -(-nvec // (THREADS * UNROLL))
    c = torch.arange(chunks)[:, None, None]
    u = torch.arange(UNROLL)[None, :, None]
    tx = torch.arange(THREADS)[None, None, :]
    vec = (c * THREADS * UNROLL + u * THREADS + tx).flatten()
    vec = vec[vec < nvec]
    assert torch.equal(vec.sort().values, torch.arange(nvec))     # every vector of a block exactly once
    for src_t, dst_t in ((src_k, dst_k), (src_v, dst_v)):
        s = src_t.view(nb, -1).view(torch.int32).view(nb, nvec, VEC_WORDS)
        d = dst_t.view(nb, -1).view(torch.int32).view(nb, nvec, VEC_WORDS)
        for p in range(block_mapping.shape[0]):
            d[int(block_mapping[p, 1]), vec] = s[int(block_mapping[p, 0]), vec]


@pytest.mark.parametrize("scale", ["smoke", "full"])
def test_p25_chunked_copy_is_the_reference(scale):
    problem = numerics.load_problem("p25")
    torch.manual_seed(25)
    src_k, src_v, dst_k, dst_v, mapping = problem.make_inputs(device="cpu", scale=scale)
    ref_k, ref_v = dst_k.clone(), dst_v.clone()
    problem.reference(src_k, src_v, ref_k, ref_v, mapping)
    _p25_kernel(src_k, src_v, dst_k, dst_v, mapping)
    assert torch.equal(dst_k, ref_k) and torch.equal(dst_v, ref_v)


def _p19_kernel(qkv, positions, qw, kw, cos_sin, slots, kv_cache, eps):
    """Returns q and updates kv_cache in place, in the fused kernel's fp32 order."""
    tokens = qkv.shape[0]
    _, _, bs, kv, d = kv_cache.shape
    heads = qkv.shape[1] // d - 2 * kv
    rh = cos_sin.shape[1] // 2
    x = qkv.view(tokens, heads + 2 * kv, d)[:, :heads + kv].float()
    part = torch.zeros(tokens, heads + kv, 16)
    lanes = x.view(tokens, heads + kv, 16, 8)
    for e in range(8):
        part = part + lanes[..., e] * lanes[..., e]
    for o in (1, 2, 4, 8):
        part = part + part[..., torch.arange(16) ^ o]
    assert torch.equal(part, part[..., :1].expand_as(part))      # a butterfly leaves every lane the same sum
    inv = torch.rsqrt(part[..., :1] / d + torch.tensor(eps, dtype=torch.float32))
    w = torch.cat([qw.float().expand(heads, d), kw.float().expand(kv, d)])
    v = x * inv * w
    c, s = (t.float()[:, None, :] for t in cos_sin[positions].split(rh, dim=-1))
    y = v.clone()
    y[..., :rh] = v[..., :rh] * c - v[..., rh:2 * rh] * s
    y[..., rh:2 * rh] = v[..., rh:2 * rh] * c + v[..., :rh] * s
    y = y.to(torch.bfloat16)
    valid = slots >= 0
    sl = slots[valid]
    kv_cache[0, sl // bs, sl % bs] = y[:, heads:][valid]
    kv_cache[1, sl // bs, sl % bs] = qkv.view(tokens, heads + 2 * kv, d)[:, heads + kv:][valid]
    return y[:, :heads].contiguous()


@pytest.mark.parametrize("scale", ["smoke", "full"])
def test_p19_fused_norm_rope_inside_the_tolerance(scale):
    problem = numerics.load_problem("p19")
    torch.manual_seed(19)
    inputs = problem.make_inputs(device="cpu", scale=scale)
    ref_cache, out_cache = inputs[6].clone(), inputs[6].clone()
    anchor_in = numerics.fp64(inputs)
    ref = problem.reference(*inputs[:6], ref_cache, inputs[7])
    anchor = problem.reference(*anchor_in)
    out = _p19_kernel(*inputs[:6], out_cache, inputs[7])
    assert numerics.ratio("out", out, ref, anchor) < 0.25
    assert numerics.ratio("kv_cache", out_cache, ref_cache, anchor_in[6]) < 0.25
