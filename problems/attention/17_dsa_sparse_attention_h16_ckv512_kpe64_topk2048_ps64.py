"""DeepSeek sparse MLA attention (bf16): each query token attends only to its top-2048 selected cache slots (indices into a paged [blocks, 64, 576] latent cache, -1 = unused), scores = sm_scale * q.entry over all 576 dims, out = softmax(scores) @ entry[:512]; return out [tokens, 16, 512] (bf16) and the base-2 LSE (fp32)."""
# Source: DeepSeek-V3.2-Exp config.json: num_attention_heads 128 (tensor parallel 8 -> 16 heads per
# GPU), kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim 128, index_topk 2048, rope_scaling
# yarn (factor 40, mscale_all_dim 1). DeepSeek Sparse Attention: the lightning indexer picks 2,048
# cached tokens per query token and the main MLA (absorbed form: query [q_nope in latent space 512 |
# q_pe 64], one shared 576-d cache entry [compressed kv 512 | rope key 64] per token, output in the
# 512-d latent space) attends only to them. Softmax scale 192^-0.5 * m^2, m = 0.1 * ln(40) + 1.
# Layout: q [tokens, 16, 576]; kv_cache [6,465 blocks, 64, 576] (page size 64); indices int32
# [tokens, 2048] = global slots block * 64 + offset, distinct within a row, the valid ones first
# and -1 after them (tokens with a context shorter than 2,048 select fewer). lse = log2(sum exp).
# Workload: 62 query tokens, cache pool of 6,465 x 64 slots (477 MB). Fixed: shapes. Redrawn per
# draw: q and the cache ~ N(0, 1), each token's number of valid indices (min(2048, context) with
# context uniform in 1..6,000) and the slots (distinct, random over the pool).
# SOL bytes count the 62 x 2,048 entries gathered, not the whole pool.
import math

import torch

DTYPE = "bf16"
SOL = {
    "flops": 2 * 62 * 16 * 2048 * (576 + 512),
    "bytes": 2 * 62 * 16 * 576 + 2 * 62 * 2048 * 576 + 4 * 62 * 2048 + 2 * 62 * 16 * 512 + 4 * 62 * 16,
}

SM_SCALE = 192 ** -0.5 * (0.1 * math.log(40.0) + 1.0) ** 2
RANK = 512


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        tokens, heads, blocks, block_size, topk, max_context = 62, 16, 6465, 64, 2048, 6000
    else:
        tokens, heads, blocks, block_size, topk, max_context = 4, 2, 5, 8, 16, 30
    q = torch.randn(tokens, heads, RANK + 64, device=device).to(torch.bfloat16)
    kv_cache = torch.randn(blocks, block_size, RANK + 64, device=device).to(torch.bfloat16)
    chosen = torch.rand(tokens, blocks * block_size, device=device).topk(topk, dim=-1).indices
    counts = torch.randint(1, max_context + 1, (tokens, 1), device=device).clamp(max=topk)
    counts[0] = topk  # at least one full row
    valid = torch.arange(topk, device=device)[None, :] < counts
    indices = torch.where(valid, chosen, torch.full_like(chosen, -1)).to(torch.int32)
    return [q, kv_cache, indices]


def reference(q, kv_cache, indices):
    compute = torch.promote_types(q.dtype, torch.float32)
    valid = indices >= 0
    entries = kv_cache.view(-1, kv_cache.shape[-1])[indices.long().clamp(min=0)].to(compute)  # [t, k, 576]
    scores = torch.einsum("thd,tkd->thk", q.to(compute), entries) * SM_SCALE
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    out = torch.einsum("thk,tkd->thd", torch.exp(scores - lse), entries[..., :RANK])
    return out.to(q.dtype), lse.squeeze(-1) / math.log(2.0)
