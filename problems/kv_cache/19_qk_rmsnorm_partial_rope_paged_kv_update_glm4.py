"""Split fused qkv (bf16), per-head RMSNorm of q and k (eps 1e-5), NeoX RoPE on the first 64 of 128 dims from cos_sin_cache[positions], write k and v into the paged cache at slot_mapping (skip -1); return (q, updated kv_cache)."""
# Source: GLM-4.5 (355B-A32B) config.json: num_attention_heads 96, num_key_value_heads 8,
# head_dim 128, use_qk_norm true (RMSNorm over each head's 128 dims, eps 1e-5, separate learned
# weights for q and k), partial_rotary_factor 0.5 (rotary dim 64, NeoX rotate-half pairing (i, i+32)
# within the first 64 dims; dims 64..127 pass through), rope_theta 1e6.
# Fix to the slot: the slot said 32 q heads; GLM-4.5 has 96 query heads over 8 kv heads, so 96 are
# used (one unsharded layer).
# Layout: qkv [tokens, (96 + 8 + 8) * 128] (q heads, then k heads, then v heads); positions int64;
# cos_sin_cache fp32 [max_position, 64] = [cos(p * f_i) for i < 32 | sin(p * f_i)], f_i =
# 1e6^(-2i/64); slot_mapping int64 [tokens], slot s -> block s // 16, offset s % 16, -1 = padding
# (not written); kv_cache [num_blocks, 2 (k, v), block_size 16, 8, 128].
# q is normalised and rotated in fp32 and rounded to bf16 once; k likewise before it is stored.
# Workload: 2,048 tokens, of which the last 1..128 (redrawn) are padding; cache of 256 blocks x 16.
# Fixed: shapes, eps, the cos/sin table (max position 32,768). Redrawn per draw: qkv ~ N(0, 1),
# norm weights 1 + 0.1 N(0, 1), positions, the number of padding tokens, the slots (distinct,
# random), and the prior cache contents. The inputs are not modified: the cache is returned as a
# fresh updated copy.
import torch

DTYPE = "bf16"
SOL = {
    "flops": 2048 * (96 + 8) * 128 * 4 + 2048 * (96 + 8) * 64 * 3,
    "bytes": 2 * 2048 * 112 * 128 + 8 * 2048 + 2 * 2 * 128 + 4 * 2048 * 64 + 8 * 2048
    + 2 * 256 * 2 * 16 * 8 * 128 + 2 * 2048 * 96 * 128 + 2 * 256 * 2 * 16 * 8 * 128,
}

EPS = 1e-5
ROPE_THETA = 1e6


def _cos_sin_cache(max_position, rotary_dim, device):
    inv_freq = 1.0 / ROPE_THETA ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64, device=device) / rotary_dim)
    angles = torch.arange(max_position, dtype=torch.float64, device=device)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(torch.float32)


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        tokens, heads, kv_heads, head_dim, blocks, block_size, max_pos, max_pad = 2048, 96, 8, 128, 256, 16, 32768, 128
    else:
        tokens, heads, kv_heads, head_dim, blocks, block_size, max_pos, max_pad = 12, 4, 2, 128, 6, 4, 64, 3
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, device=device).to(torch.bfloat16)
    positions = torch.randint(0, max_pos, (tokens,), device=device)
    q_norm_weight = (1.0 + 0.1 * torch.randn(head_dim, device=device)).to(torch.bfloat16)
    k_norm_weight = (1.0 + 0.1 * torch.randn(head_dim, device=device)).to(torch.bfloat16)
    cos_sin_cache = _cos_sin_cache(max_pos, head_dim // 2, device)
    pad = int(torch.randint(1, max_pad + 1, (1,)).item())
    slot_mapping = torch.full((tokens,), -1, dtype=torch.int64, device=device)
    slot_mapping[: tokens - pad] = torch.randperm(blocks * block_size, device=device)[: tokens - pad]
    kv_cache = torch.randn(blocks, 2, block_size, kv_heads, head_dim, device=device).to(torch.bfloat16)
    return [qkv, positions, q_norm_weight, k_norm_weight, cos_sin_cache, slot_mapping, kv_cache]


def _rms_norm(x, weight):
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + EPS) * weight


def _rope_neox(x, cos, sin):
    half = cos.shape[-1]
    x1, x2, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


def reference(qkv, positions, q_norm_weight, k_norm_weight, cos_sin_cache, slot_mapping, kv_cache):
    compute = torch.promote_types(qkv.dtype, torch.float32)
    tokens = qkv.shape[0]
    _, _, block_size, kv_heads, head_dim = kv_cache.shape
    heads = qkv.shape[1] // head_dim - 2 * kv_heads
    q, k, v = qkv.to(compute).split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q = _rms_norm(q.reshape(tokens, heads, head_dim), q_norm_weight.to(compute))
    k = _rms_norm(k.reshape(tokens, kv_heads, head_dim), k_norm_weight.to(compute))
    cos, sin = cos_sin_cache[positions].to(compute)[:, None, :].chunk(2, dim=-1)
    q, k = _rope_neox(q, cos, sin), _rope_neox(k, cos, sin)
    new_cache = kv_cache.clone()
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    block, offset = slots // block_size, slots % block_size
    new_cache[block, 0, offset] = k[valid].to(kv_cache.dtype)
    new_cache[block, 1, offset] = v.reshape(tokens, kv_heads, head_dim)[valid].to(kv_cache.dtype)
    return q.to(qkv.dtype), new_cache
