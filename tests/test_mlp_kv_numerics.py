"""CPU replays of the pending p20, p41 and p42 solutions' exact arithmetic, checked against the problems.

The GPU grades the kernels; here their rounding is replayed in torch: p42's dual RMSNorm (fp32 sums of
squares, x * rstd rounded to bf16, times the bf16 weight rounded to bf16) and p20's RoPE (every bf16
product and sum rounded as the reference's bf16 arithmetic, so the cache rows must equal the
reference's bit for bit), with their bf16 WGMMA GEMMs as fp32-accumulated products rounded to bf16; and
p41's fp32 SIMT GEMM in its exact order (a fresh FMA chain per 32-wide k-tile, tile sums added in
fp32) with the per-head norm's lane partial sums and shuffle butterfly.
Each must stay well inside the judge's tolerance (mkb.tensortree.compare against the fp64 anchor) at
smoke scale and on full-scale slices.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numerics  # noqa: E402  (tests/: the replays' shared loader and tolerance ratio)


def _bf(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


def _gemm_bf16(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The bf16 WGMMA GEMM: exact bf16 products, fp32 accumulation, rounded to bf16 once."""
    return (a.double() @ w.double().T).float().to(torch.bfloat16)


def _p42_kernel(input_ids, hidden, embed, enorm_w, hnorm_w, w_eh, eps):
    b, s, d = hidden.shape
    ids = torch.zeros_like(input_ids)
    ids[:, :-1] = input_ids[:, 1:]                      # the kernel's shifted lookup; 0 at the last position

    def norm(x, w):
        f = x.float()
        rstd = torch.rsqrt((f * f).sum(-1, keepdim=True) / d + eps)
        return _bf(w.float() * _bf(f * rstd))

    z = torch.cat([norm(embed[ids], enorm_w), norm(hidden, hnorm_w)], dim=-1)
    return _gemm_bf16(z.reshape(b * s, 2 * d), w_eh).view(b, s, -1)


@pytest.mark.parametrize("scale", ["smoke", "slice"])
def test_p42_dual_norm_and_gemm_inside_the_tolerance(scale):
    problem = numerics.load_problem("p42")
    torch.manual_seed(42)
    if scale == "smoke":
        inputs = problem.make_inputs(device="cpu", scale="smoke")
    else:  # full-scale width 4096 (z 8192 wide), 2 sequences x 16 positions, 256 output channels
        d, bf = 4096, torch.bfloat16
        inputs = [torch.randint(0, 3000, (2, 16)), torch.randn(2, 16, d, dtype=bf), torch.randn(3000, d, dtype=bf),
                  (1 + 0.1 * torch.randn(d)).to(bf), (1 + 0.1 * torch.randn(d)).to(bf),
                  (torch.randn(256, 2 * d) / (2 * d) ** 0.5).to(bf), problem.EPS]
    out = _p42_kernel(*inputs)
    assert numerics.judged_ratio(problem, inputs, out) < 0.5


def _p20_kernel(qkv_lora, q_b_weight, positions, cos_sin_cache, slot_mapping, kv_cache, p):
    """Returns q and updates kv_cache in place, as the two kernels do."""
    tokens, half = qkv_lora.shape[0], p.ROPE // 2
    q = _gemm_bf16(qkv_lora[:, :p.Q_RANK], q_b_weight).view(tokens, p.HEADS, p.NOPE + p.ROPE)
    cos, sin = cos_sin_cache[positions].float().split(half, dim=-1)

    def rotate(x, c, s):
        x1, x2 = x[..., :half].float(), x[..., half:].float()
        return torch.cat([_bf(x1 * c) - _bf(x2 * s), _bf(x2 * c) + _bf(x1 * s)], dim=-1).to(torch.bfloat16)

    q[..., p.NOPE:] = rotate(q[..., p.NOPE:], cos[:, None], sin[:, None])
    k_pe = rotate(qkv_lora[:, p.Q_RANK + p.KV_RANK:], cos, sin)
    flat = kv_cache.view(-1, kv_cache.shape[-1])
    for t in range(tokens):
        if int(slot_mapping[t]) >= 0:
            flat[int(slot_mapping[t])] = torch.cat([qkv_lora[t, p.Q_RANK:p.Q_RANK + p.KV_RANK], k_pe[t]])
    return q


@pytest.mark.parametrize("scale", ["smoke", "slice"])
def test_p20_rope_is_bit_exact_and_q_inside_the_tolerance(scale):
    problem = numerics.load_problem("p20")
    torch.manual_seed(20)
    inputs = problem.make_inputs(device="cpu", scale="full" if scale == "slice" else "smoke")
    if scale == "slice":  # the full cache, cos/sin table and weight; 96 tokens, the last 5 padding
        qkv, w, pos, cs, slots, cache = inputs
        slots = slots[:96].clone()
        slots[-5:] = -1
        inputs = [qkv[:96], w, pos[:96], cs, slots, cache]
    ref_cache, out_cache, anchor_cache = (inputs[5].clone() for _ in range(3))
    ref = problem.reference(*inputs[:5], ref_cache)
    out = _p20_kernel(*inputs[:5], out_cache, problem)
    anchor = problem.reference(*[t.double() if t.is_floating_point() else t for t in inputs[:5]],
                               anchor_cache.double())
    assert torch.equal(out_cache, ref_cache)           # kv_c copied, k_pe rotated with torch's bf16 rounding
    assert not torch.equal(out_cache, inputs[5])       # the slots were written
    assert numerics.ratio("out", out, ref, anchor) < 0.5


def _simt_gemm(x: torch.Tensor, w: torch.Tensor, bk: int = 32) -> torch.Tensor:
    """The SIMT GEMM's order: per k-tile a chain of bk FMAs from zero (fp64 product and sum, rounded to fp32
    once: a fused multiply-add), the tile sums added to the fp32 accumulator in k order."""
    acc = torch.zeros(x.shape[0], w.shape[0], dtype=torch.float32)
    xd, wd = x.double(), w.double()
    for k0 in range(0, x.shape[1], bk):
        tile = torch.zeros_like(acc)
        for k in range(k0, k0 + bk):
            tile = (tile.double() + xd[:, k, None] * wd[None, :, k]).float()
        acc = acc + tile
    return acc


def _head_norm(t: torch.Tensor, weight: torch.Tensor, eps: float, masks) -> torch.Tensor:
    """The epilogue on [rows, heads, d]: each lane's 4-column sum of squares, a shuffle butterfly over the
    d / 4 lanes in the given mask order, rsqrt(sum / d + eps), then t * rstd * weight."""
    rows, heads, d = t.shape
    sq = t * t
    part = ((sq[..., 0::4] + sq[..., 1::4]) + sq[..., 2::4]) + sq[..., 3::4]   # lane l holds columns 4l..4l+3
    lanes = torch.arange(d // 4)
    for mask in masks:
        part = part + part[..., lanes ^ mask]
    rstd = torch.rsqrt(part[..., :1] / d + eps)
    return t * rstd * weight


@pytest.mark.parametrize("dsl", ["cutedsl", "tirx"])
@pytest.mark.parametrize("scale", ["smoke", "slice"])
def test_p41_simt_gemm_and_head_norm_inside_the_tolerance(dsl, scale):
    problem = numerics.load_problem("p41")
    torch.manual_seed(41)
    if scale == "smoke":
        inputs = problem.make_inputs(device="cpu", scale="smoke")
    else:  # full-scale K = 1024 and head dim 128: 48 tokens, two heads of each projection
        k, d = 1024, 128
        inputs = [torch.randn(1, 48, k)] + [torch.randn(2 * d, k) / k ** 0.5 for _ in range(3)] + \
                 [1 + 0.1 * torch.randn(d), 1 + 0.1 * torch.randn(d), problem.EPS]
    x, w_q, w_k, w_v, qn, kn, eps = inputs
    b, s, k = x.shape
    d = qn.shape[0]
    lanes = d // 4
    masks = [1 << o for o in range(lanes.bit_length() - 1)]          # CuTe: offsets 1, 2, 4, ...
    if dsl == "tirx":
        masks = masks[::-1]                                          # TIRx warp_sum: 16, 8, ..., 1
    x2 = x.reshape(b * s, k)
    outs = [_simt_gemm(x2, w).view(b * s, -1, d) for w in (w_q, w_k, w_v)]
    outs = (_head_norm(outs[0], qn, eps, masks), _head_norm(outs[1], kn, eps, masks), outs[2])
    refs = problem.reference(*inputs)
    anchors = problem.reference(*[t.double() if torch.is_tensor(t) else t for t in inputs])
    for out, ref, anchor in zip(outs, refs, anchors):
        assert numerics.ratio("out", out.view(ref.shape), ref, anchor) < 0.5
