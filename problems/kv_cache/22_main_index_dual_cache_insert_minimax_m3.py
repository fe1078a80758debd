"""Split a fused [q 16 | k 4 | v 4 | index_q 4 | index_k 1] x 128 projection (bf16), apply per-head Gemma RMSNorm (x * rsqrt(mean x^2 + 1e-6) * (1 + w)) and NeoX RoPE on the first 64 dims to q, k, index_q, index_k; write k, v into kv_cache at slot_mapping and index_k into index_cache at index_slot_mapping, in place; return (q, index_q)."""
# Source: MiniMax-M3's sparse-attention layer prologue (per-head zero-centred RMSNorm on q and k,
# partial NeoX RoPE over the first 64 of 128 dims, rope_theta 5e6; a lightning-indexer branch with
# its own query heads and one index key per token kept in a paged side cache) in the shape of the
# original MetaKernelBench p22, taken from vLLM's fused MiniMax-M3 qk-norm + RoPE + KV-insert test:
# 16 q / 4 kv / 4 index-q heads x 128, 513 tokens, 10 blocks of 64 slots, 4,096 positions.
# Layout: qkv [513, (16 + 4 + 4 + 4 + 1) * 128] (q, k, v, index-q heads, then the index key);
# four norm weights bf16 [128] (q, k, index_q, index_k; applied as 1 + w); positions int64;
# cos_sin_cache bf16 [4096, 64] = [cos(p f_i), i < 32 | sin(p f_i)], f_i = 5e6^(-2i/64) (computed
# in fp32, rounded to bf16); slot_mapping, index_slot_mapping int64 [513] (independent; slot s ->
# block s // 64, offset s % 64); kv_cache [10, 4 heads, 64, 256] = [k 128 | v 128] per head and
# slot; index_cache [10, 64, 128].
# Rounding as in the original: norm in fp32, rounded to bf16; the rotation in fp32 on the rounded
# values, rounded to bf16. q and index_q are returned; kv_cache and index_cache are updated in place
# (MUTATES). The original also returns both caches (the same tensors); here they are graded in place.
# Workload: 513 tokens (a prefill chunk) into 640 slots. Fixed: shapes, eps, the cos/sin table.
# Redrawn per draw: qkv and the prior caches ~ N(0, 1), norm weights 0.1 N(0, 1), positions uniform
# in 0..4,095, both slot mappings (distinct, random).
import torch

DTYPE = "bf16"
MUTATES = ("kv_cache", "index_cache")
SOL = {
    "flops": 513 * (16 + 4 + 4 + 1) * 128 * 5 + 513 * (16 + 4 + 4 + 1) * 64 * 3,
    "bytes": 2 * 513 * 29 * 128 + 4 * 2 * 128 + 8 * 513 + 2 * 513 * 64 + 2 * 8 * 513
    + 2 * 513 * 20 * 128 + 2 * 513 * 4 * 256 + 2 * 513 * 128,
}

HEADS, KV_HEADS, INDEX_HEADS, HEAD_DIM, ROTARY_DIM = 16, 4, 4, 128, 64
EPS = 1e-6
ROPE_BASE = 5_000_000.0


def _cos_sin_cache(max_position, device):
    dims = torch.arange(0, ROTARY_DIM, 2, dtype=torch.float32, device=device)
    angles = torch.outer(torch.arange(max_position, dtype=torch.float32, device=device),
                         1.0 / ROPE_BASE ** (dims / ROTARY_DIM))
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(torch.bfloat16)


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        tokens, blocks, block_size, max_pos = 513, 10, 64, 4096
    else:
        tokens, blocks, block_size, max_pos = 9, 3, 4, 64
    bf16 = torch.bfloat16
    qkv = torch.randn(tokens, (HEADS + 2 * KV_HEADS + INDEX_HEADS + 1) * HEAD_DIM, device=device, dtype=bf16)
    norm_weights = [torch.randn(HEAD_DIM, device=device, dtype=bf16) * 0.1 for _ in range(4)]
    positions = torch.randint(0, max_pos, (tokens,), device=device)
    cos_sin_cache = _cos_sin_cache(max_pos, device)
    slot_mapping = torch.randperm(blocks * block_size, device=device)[:tokens]
    index_slot_mapping = torch.randperm(blocks * block_size, device=device)[:tokens]
    kv_cache = torch.randn(blocks, KV_HEADS, block_size, 2 * HEAD_DIM, device=device, dtype=bf16)
    index_cache = torch.randn(blocks, block_size, HEAD_DIM, device=device, dtype=bf16)
    return [qkv, *norm_weights, positions, cos_sin_cache, slot_mapping, index_slot_mapping, kv_cache, index_cache]


def _norm_rope(x, weight, cos, sin):
    """Gemma RMSNorm per head, rounded to x's dtype, then NeoX RoPE on the first ROTARY_DIM dims."""
    wide_dtype = torch.promote_types(x.dtype, torch.float32)
    wide = x.to(wide_dtype)
    normed = (wide * torch.rsqrt(wide.pow(2).mean(dim=-1, keepdim=True) + EPS) * (1.0 + weight.to(wide_dtype)))
    normed = normed.to(x.dtype)
    half = ROTARY_DIM // 2
    x1, x2 = normed[..., :half].to(wide_dtype), normed[..., half:ROTARY_DIM].to(wide_dtype)
    rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
    return torch.cat([rotated, normed[..., ROTARY_DIM:]], dim=-1)


def reference(qkv, q_norm_weight, k_norm_weight, index_q_norm_weight, index_k_norm_weight, positions,
              cos_sin_cache, slot_mapping, index_slot_mapping, kv_cache, index_cache):
    tokens = qkv.shape[0]
    block_size = index_cache.shape[1]
    q, k, v, index_q, index_k = qkv.view(tokens, -1, HEAD_DIM).split([HEADS, KV_HEADS, KV_HEADS, INDEX_HEADS, 1], 1)
    wide_dtype = torch.promote_types(qkv.dtype, torch.float32)
    cos, sin = cos_sin_cache[positions].to(wide_dtype)[:, None, :].chunk(2, dim=-1)
    q = _norm_rope(q, q_norm_weight, cos, sin)
    k = _norm_rope(k, k_norm_weight, cos, sin)
    index_q = _norm_rope(index_q, index_q_norm_weight, cos, sin)
    index_k = _norm_rope(index_k, index_k_norm_weight, cos, sin)[:, 0]
    block, offset = slot_mapping // block_size, slot_mapping % block_size
    kv_cache[block, :, offset] = torch.cat([k, v], dim=-1)
    index_cache[index_slot_mapping // block_size, index_slot_mapping % block_size] = index_k
    return q, index_q
