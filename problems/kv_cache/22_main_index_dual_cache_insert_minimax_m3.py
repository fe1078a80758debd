"""Split a fused [q 16 | k 4 | v 4 | index_q 4 | index_k 1] x 128 projection (bf16), apply per-head Gemma RMSNorm (x * rsqrt(mean x^2 + 1e-6) * (1 + w)) and NeoX RoPE on the first 64 dims to q, k, index_q, index_k; write k, v into the paged main cache and index_k into the paged index cache at slot_mapping; return (q, index_q, kv_cache, index_cache)."""
# Source: MiniMax-M3 (sparse-attention layers): per-head Gemma-style RMSNorm on q and k
# (zero-centred weight, applied as 1 + w, eps 1e-6), partial NeoX RoPE (rotary_dim 64 of
# head_dim 128, rotate-half pairing (i, i + 32) inside the first 64 dims, the last 64 pass
# through), rope_theta 5e6; an index ("lightning indexer") branch with 4 index-query heads x 128
# and one index-key vector per token kept in a paged side cache parallel to the main K/V cache
# (disable_index_value: no index values). Heads per GPU as in the slot: 16 q / 4 kv / 4 index-q.
# In this problem the index q and index k get their own per-head Gemma RMSNorm weights and the
# same partial RoPE as the main q and k.
# Layout: qkv [tokens, (16 + 4 + 4 + 4 + 1) * 128] (q heads, k heads, v heads, index-q heads,
# index k); norm weights [128] each (q, k, index_q, index_k); positions int64; cos_sin_cache fp32
# [8192, 64] = [cos(p f_i), i < 32 | sin(p f_i)], f_i = 5e6^(-2i/64); slot_mapping int64 [tokens],
# slot s -> block s // 64, offset s % 64; kv_cache [10, 2 (k, v), 64, 4, 128];
# index_cache [10, 64, 128]. Norm and RoPE run in fp32, rounded to bf16 once.
# Workload: 513 tokens (a prefill chunk), caches of 10 blocks x 64 (640 slots). Fixed: shapes,
# eps, theta, the cos/sin table. Redrawn per draw: qkv ~ N(0, 1), norm weights 0.1 N(0, 1),
# positions (< 8,192), the slots (distinct, random) and the prior contents of both caches. The
# caches are returned as fresh updated copies.
import torch

DTYPE = "bf16"
SOL = {
    "flops": 513 * (16 + 4 + 4 + 1) * 128 * 5 + 513 * (16 + 4 + 4 + 1) * 64 * 3,
    "bytes": 2 * 513 * 29 * 128 + 4 * 2 * 128 + 8 * 513 + 4 * 513 * 64 + 8 * 513
    + 2 * 2 * 10 * 2 * 64 * 4 * 128 + 2 * 2 * 10 * 64 * 128 + 2 * 513 * 20 * 128,
}

HEADS, KV_HEADS, INDEX_HEADS, HEAD_DIM, ROTARY_DIM = 16, 4, 4, 128, 64
EPS = 1e-6
ROPE_THETA = 5e6


def _cos_sin_cache(max_position, device):
    inv_freq = ROPE_THETA ** (-torch.arange(0, ROTARY_DIM, 2, dtype=torch.float64, device=device) / ROTARY_DIM)
    angles = torch.arange(max_position, dtype=torch.float64, device=device)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(torch.float32)


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        tokens, blocks, block_size, max_pos = 513, 10, 64, 8192
    else:
        tokens, blocks, block_size, max_pos = 9, 3, 4, 64
    width = (HEADS + 2 * KV_HEADS + INDEX_HEADS + 1) * HEAD_DIM
    qkv = torch.randn(tokens, width, device=device).to(torch.bfloat16)
    norm_weights = [(0.1 * torch.randn(HEAD_DIM, device=device)).to(torch.bfloat16) for _ in range(4)]
    positions = torch.randint(0, max_pos, (tokens,), device=device)
    cos_sin_cache = _cos_sin_cache(max_pos, device)
    slot_mapping = torch.randperm(blocks * block_size, device=device)[:tokens]
    kv_cache = torch.randn(blocks, 2, block_size, KV_HEADS, HEAD_DIM, device=device).to(torch.bfloat16)
    index_cache = torch.randn(blocks, block_size, HEAD_DIM, device=device).to(torch.bfloat16)
    return [qkv, *norm_weights, positions, cos_sin_cache, slot_mapping, kv_cache, index_cache]


def _gemma_rms_norm(x, weight):
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + EPS) * (1.0 + weight)


def _rope_neox(x, cos, sin):
    half = cos.shape[-1]
    x1, x2, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


def reference(qkv, q_norm_weight, k_norm_weight, index_q_norm_weight, index_k_norm_weight, positions,
              cos_sin_cache, slot_mapping, kv_cache, index_cache):
    compute = torch.promote_types(qkv.dtype, torch.float32)
    tokens = qkv.shape[0]
    blocks, _, block_size, kv_heads, head_dim = kv_cache.shape
    parts = qkv.to(compute).view(tokens, -1, head_dim).split([HEADS, KV_HEADS, KV_HEADS, INDEX_HEADS, 1], dim=1)
    q, k, v, index_q, index_k = parts
    cos, sin = cos_sin_cache[positions].to(compute)[:, None, :].chunk(2, dim=-1)

    def norm_rope(x, weight):
        return _rope_neox(_gemma_rms_norm(x, weight.to(compute)), cos, sin)

    q = norm_rope(q, q_norm_weight)
    k = norm_rope(k, k_norm_weight)
    index_q = norm_rope(index_q, index_q_norm_weight)
    index_k = norm_rope(index_k, index_k_norm_weight)
    block, offset = slot_mapping // block_size, slot_mapping % block_size
    new_kv_cache = kv_cache.clone()
    new_kv_cache[block, 0, offset] = k.to(kv_cache.dtype)
    new_kv_cache[block, 1, offset] = v.to(kv_cache.dtype)
    new_index_cache = index_cache.clone()
    new_index_cache[block, offset] = index_k[:, 0].to(index_cache.dtype)
    return q.to(qkv.dtype), index_q.to(qkv.dtype), new_kv_cache, new_index_cache
