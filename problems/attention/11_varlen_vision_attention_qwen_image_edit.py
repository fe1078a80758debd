"""Vision-tower self-attention over variable-length image sequences (bf16): qkv = x @ qkv_weight.T + qkv_bias, rotary embedding (rotate-half with the given cos/sin) on q and k, full bidirectional attention inside each sequence (cu_seqlens = sequence ends), then out = attn @ proj_weight.T + proj_bias; return out [7168, 1152] (bf16)."""
# Source: the vision-tower attention of Qwen-Image-Edit-2509's multimodal encoder (embed 1152,
# 16 heads x 72, qkv and proj Linear layers with biases, images packed back to back and attending
# only within themselves, scale 72^-0.5) in the shape of the original MetaKernelBench p11 (a
# SOL-ExecBench recipe; only part of its text is visible): 7,168 tokens in 28 sequences with the
# lengths SEQ_SPLITS fixed below, RoPE base 10,000 over each sequence's own positions 0..len-1:
# f_i = 10000^(-i/36), i < 36, angles [p f_0..p f_35 | the same again] (72 dims), pairs (i, i + 36).
# Layout: hidden_states [7168, 1152]; cu_seqlens int64 [28] (the running sum of the lengths: the end
# of each sequence; sequence i spans cu_seqlens[i-1] (0 for the first) to cu_seqlens[i]); cos, sin
# [7168, 16, 72] (the same table for every head); qkv_weight [3456, 1152] ([q | k | v], each
# head-major), qkv_bias [3456], proj_weight [1152, 1152], proj_bias [1152].
# Our reading where the recipe is hidden: the argument order after cu_seqlens, the cos/sin dtype
# (bf16), and the rounding: projections in bf16 (fp32 accumulation), the rotation in fp32 rounded to
# bf16, attention per sequence in fp32 rounded to bf16 before the output projection.
# Fixed: shapes, the lengths, the cos/sin tables. Redrawn per draw: hidden_states ~ N(0, 1), weights
# ~ N(0, 1/1152), biases 0.1 N(0, 1).
import math

import torch
import torch.nn.functional as F

DTYPE = "bf16"
SOL = {
    "flops": 2 * 7168 * 1152 * 3456 + 2 * 7168 * 1152 * 1152 + 4 * 16 * 72 * 2620654 + 6 * 7168 * 2 * 1152,
    "bytes": 2 * 7168 * 1152 + 8 * 28 + 2 * 2 * 7168 * 16 * 72 + 2 * 3456 * 1152 + 2 * 3456 + 2 * 1152 * 1152
    + 2 * 1152 + 2 * 7168 * 1152,
}

EMBED_DIM, NUM_HEADS, HEAD_DIM = 1152, 16, 72
SEQ_SPLITS = (255, 85, 425, 170, 680, 85, 170, 340, 85, 510, 170, 255, 85, 340, 170, 425, 85, 255, 170, 85, 170, 510,
              340, 170, 255, 170, 85, 623)
ROPE_THETA = 10000.0


def make_inputs(device="cuda", scale="full"):
    splits = SEQ_SPLITS if scale == "full" else (5, 3, 8)
    lengths = torch.tensor(splits, device=device, dtype=torch.int64)
    cu_seqlens = lengths.cumsum(0)
    tokens = sum(splits)
    positions = torch.arange(tokens, device=device) - torch.repeat_interleave(cu_seqlens - lengths, lengths)
    half = HEAD_DIM // 2
    inv_freq = 1.0 / ROPE_THETA ** (torch.arange(0, half, device=device, dtype=torch.float32) / half)
    angles = torch.outer(positions.to(torch.float32), inv_freq).repeat(1, 2)[:, None, :]
    cos = angles.cos().to(torch.bfloat16).expand(tokens, NUM_HEADS, HEAD_DIM).contiguous()
    sin = angles.sin().to(torch.bfloat16).expand(tokens, NUM_HEADS, HEAD_DIM).contiguous()
    bf16 = torch.bfloat16
    hidden_states = torch.randn(tokens, EMBED_DIM, device=device, dtype=bf16)
    qkv_weight = torch.randn(3 * EMBED_DIM, EMBED_DIM, device=device, dtype=bf16) / math.sqrt(EMBED_DIM)
    qkv_bias = 0.1 * torch.randn(3 * EMBED_DIM, device=device, dtype=bf16)
    proj_weight = torch.randn(EMBED_DIM, EMBED_DIM, device=device, dtype=bf16) / math.sqrt(EMBED_DIM)
    proj_bias = 0.1 * torch.randn(EMBED_DIM, device=device, dtype=bf16)
    return [hidden_states, cu_seqlens, cos, sin, qkv_weight, qkv_bias, proj_weight, proj_bias]


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def reference(hidden_states, cu_seqlens, cos, sin, qkv_weight, qkv_bias, proj_weight, proj_bias):
    compute = torch.promote_types(hidden_states.dtype, torch.float32)
    dtype, tokens = hidden_states.dtype, hidden_states.shape[0]
    q, k, v = F.linear(hidden_states, qkv_weight, qkv_bias).view(tokens, 3, NUM_HEADS, HEAD_DIM).unbind(1)
    c, s = cos.to(compute), sin.to(compute)
    q = (q.to(compute) * c + _rotate_half(q.to(compute)) * s).to(dtype)
    k = (k.to(compute) * c + _rotate_half(k.to(compute)) * s).to(dtype)
    attn = torch.empty(tokens, NUM_HEADS, HEAD_DIM, dtype=dtype, device=hidden_states.device)
    ends = cu_seqlens.tolist()
    for start, end in zip([0] + ends[:-1], ends):
        qs, ks, vs = (t[start:end].to(compute).transpose(0, 1) for t in (q, k, v))
        weights = torch.softmax(qs @ ks.transpose(1, 2) / math.sqrt(HEAD_DIM), dim=-1)
        attn[start:end] = (weights @ vs).transpose(0, 1).to(dtype)
    return F.linear(attn.view(tokens, EMBED_DIM), proj_weight, proj_bias)
