"""DeepSeek MLA prologue (bf16): q = q_c @ w_q_b.T split per head into nope 128 + rope 64, interleaved YaRN RoPE on the rope parts of q and of the shared key; RMSNorm (eps 1e-6) of the 512-d compressed kv; write [kv_c | k_pe] into the paged cache at slot_mapping (skip -1); return (q [tokens, 16, 192], updated kv_cache)."""
# Source: DeepSeek-V3 config.json: q_lora_rank 1536, kv_lora_rank 512, qk_nope_head_dim 128,
# qk_rope_head_dim 64, num_attention_heads 128 (tensor parallel 8 -> 16 heads per GPU),
# rms_norm_eps 1e-6, rope_theta 10000, rope_scaling yarn (factor 40,
# original_max_position_embeddings 4096, beta_fast 32, beta_slow 1, mscale 1, mscale_all_dim 1, so
# the cos/sin magnitude correction is 1). DeepSeek rotates interleaved pairs (2i, 2i+1) of the
# 64 rope dims by angle position * inv_freq[i]; the key's rope part is one vector shared by all
# heads. The kv_a projection output [compressed kv 512 | k_pe 64] is the input here; the compressed
# kv goes through kv_a_layernorm before caching; q_c is the q_a_layernorm output.
# YaRN inv_freq (fixed, computed in make_inputs): f_extra[i] = 10000^(-2i/64), f_inter = f_extra / 40,
# blended with weight ramp[i] = clamp((i - low) / (high - low), 0, 1), low = floor(c(32)),
# high = ceil(c(1)), c(n) = 64 ln(4096 / (2 pi n)) / (2 ln 10000): inv_freq = f_inter * ramp +
# f_extra * (1 - ramp).
# Layout: q_c [tokens, 1536]; w_q_b [16 * 192, 1536] (head-major, each head nope 128 then rope 64);
# kv_a [tokens, 576]; kv_norm_weight [512]; positions int64; cos_sin_cache fp32 [32768, 64] =
# [cos(p f_i), i < 32 | sin(p f_i)]; slot_mapping int64, slot s -> block s // 64, offset s % 64,
# -1 = padding (not written); kv_cache [num_blocks, 64, 576] = [kv_c 512 | k_pe 64] per token.
# The q GEMM runs in the input dtype (bf16, fp32 accumulation); RoPE and RMSNorm in fp32.
# Workload: 2,048 tokens (the last 1..64, redrawn, are padding), cache 256 blocks x 64.
# Fixed: shapes, eps, the cos/sin table. Redrawn per draw: q_c, kv_a ~ N(0, 1), w_q_b ~
# N(0, 1/1536), kv_norm_weight 1 + 0.1 N(0, 1), positions (< 32,768), padding count, slots
# (distinct, random), prior cache contents. The cache is returned as a fresh updated copy.
import math

import torch
import torch.nn.functional as F

DTYPE = "bf16"
SOL = {
    "flops": 2 * 2048 * 1536 * 3072 + 2048 * (16 + 1) * 64 * 3 + 2048 * 512 * 4,
    "bytes": 2 * 2048 * 1536 + 2 * 3072 * 1536 + 2 * 2048 * 576 + 2 * 512 + 8 * 2048 + 4 * 2048 * 64 + 8 * 2048
    + 2 * 2 * 256 * 64 * 576 + 2 * 2048 * 3072,
}

HEADS, NOPE, ROPE, KV_RANK, Q_RANK = 16, 128, 64, 512, 1536
EPS = 1e-6


def _yarn_inv_freq(device):
    dim, base, factor, original_max = ROPE, 10000.0, 40.0, 4096
    f_extra = base ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim)
    f_inter = f_extra / factor

    def correction(rotations):
        return dim * math.log(original_max / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction(32)), 0)
    high = min(math.ceil(correction(1)), dim - 1)
    ramp = ((torch.arange(dim // 2, dtype=torch.float64, device=device) - low) / (high - low)).clamp(0, 1)
    return f_inter * ramp + f_extra * (1 - ramp)


def _cos_sin_cache(max_position, device):
    angles = torch.arange(max_position, dtype=torch.float64, device=device)[:, None] * _yarn_inv_freq(device)
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(torch.float32)


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        tokens, blocks, block_size, max_pos, max_pad = 2048, 256, 64, 32768, 64
    else:
        tokens, blocks, block_size, max_pos, max_pad = 10, 4, 8, 64, 3
    q_c = torch.randn(tokens, Q_RANK, device=device).to(torch.bfloat16)
    w_q_b = (torch.randn(HEADS * (NOPE + ROPE), Q_RANK, device=device) / math.sqrt(Q_RANK)).to(torch.bfloat16)
    kv_a = torch.randn(tokens, KV_RANK + ROPE, device=device).to(torch.bfloat16)
    kv_norm_weight = (1.0 + 0.1 * torch.randn(KV_RANK, device=device)).to(torch.bfloat16)
    positions = torch.randint(0, max_pos, (tokens,), device=device)
    cos_sin_cache = _cos_sin_cache(max_pos, device)
    pad = int(torch.randint(1, max_pad + 1, (1,)).item())
    slot_mapping = torch.full((tokens,), -1, dtype=torch.int64, device=device)
    slot_mapping[: tokens - pad] = torch.randperm(blocks * block_size, device=device)[: tokens - pad]
    kv_cache = torch.randn(blocks, block_size, KV_RANK + ROPE, device=device).to(torch.bfloat16)
    return [q_c, w_q_b, kv_a, kv_norm_weight, positions, cos_sin_cache, slot_mapping, kv_cache]


def _rope_interleaved(x, cos, sin):
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2)


def reference(q_c, w_q_b, kv_a, kv_norm_weight, positions, cos_sin_cache, slot_mapping, kv_cache):
    compute = torch.promote_types(q_c.dtype, torch.float32)
    tokens = q_c.shape[0]
    cos, sin = cos_sin_cache[positions].to(compute).chunk(2, dim=-1)
    q = F.linear(q_c, w_q_b).view(tokens, HEADS, NOPE + ROPE)
    q_pe = _rope_interleaved(q[..., NOPE:].to(compute), cos[:, None, :], sin[:, None, :])
    q = torch.cat([q[..., :NOPE], q_pe.to(q.dtype)], dim=-1)
    kv_c = kv_a[:, :KV_RANK].to(compute)
    kv_c = kv_c * torch.rsqrt(kv_c.pow(2).mean(dim=-1, keepdim=True) + EPS) * kv_norm_weight.to(compute)
    k_pe = _rope_interleaved(kv_a[:, KV_RANK:].to(compute), cos, sin)
    entry = torch.cat([kv_c, k_pe], dim=-1).to(kv_cache.dtype)
    new_cache = kv_cache.clone()
    valid = slot_mapping >= 0
    new_cache.view(-1, KV_RANK + ROPE)[slot_mapping[valid]] = entry[valid]
    return q, new_cache
