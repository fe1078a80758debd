"""GQA paged decode attention (page size 1, bf16, 5 q heads sharing 1 kv head): one query token per sequence over its KV pages listed in kv_indices[kv_indptr[b]:kv_indptr[b+1]]; return out (bf16) and the base-2 log-sum-exp of the scaled scores (fp32)."""
# Source: Llama-4-Scout-17B-16E config.json: num_attention_heads 40, num_key_value_heads 8, head_dim 128;
# tensor parallel 8 gives 5 query heads and 1 kv head per GPU (all 5 read it). Softmax scale 1/sqrt(128).
# The attention core only: RoPE/NoPE and Llama 4's query temperature scaling are applied before
# this step, and no chunked-attention window is applied (a global-attention layer).
# Layout: q [batch, 5, 128]; k_cache, v_cache [num_pages, page_size=1, 1, 128] (NHD pages);
# kv_indptr int32 [batch + 1] and kv_indices int32 [total kv tokens] (CSR page table, one page per
# token, pages in token order). lse[b, h] = log2(sum_j exp(sm_scale * q.k_j)) (base 2, as paged
# attention kernels return it for merging partial results).
# Workload: batch 63 decode requests, 19,134 KV tokens in all (lengths a random split of the total,
# each >= 1), drawn from a pool of 53,173 pages. Fixed: shapes, total KV tokens, pool size.
# Redrawn per draw: q, both caches ~ N(0, 1); the per-sequence lengths and the page ids (distinct
# pages drawn at random from the pool).
import math

import torch

DTYPE = "bf16"
SOL = {
    "flops": 4 * 5 * 128 * 19134,
    "bytes": 2 * 63 * 5 * 128 + 2 * 2 * 19134 * 1 * 128 + 4 * 19134 + 4 * 64 + 2 * 63 * 5 * 128 + 4 * 63 * 5,
}

SM_SCALE = 1.0 / math.sqrt(128)


def _split(total, parts, device):
    """Random lengths >= 1 that sum to total."""
    cuts = torch.randperm(total - 1, device=device)[: parts - 1] + 1
    bounds = torch.cat([torch.zeros(1, dtype=torch.int64, device=device), cuts.sort().values,
                        torch.full((1,), total, dtype=torch.int64, device=device)])
    return bounds.diff()


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        batch, heads, kv_heads, head_dim, total, pool = 63, 5, 1, 128, 19134, 53173
    else:
        batch, heads, kv_heads, head_dim, total, pool = 3, 5, 1, 128, 20, 40
    q = torch.randn(batch, heads, head_dim, device=device).to(torch.bfloat16)
    k_cache = torch.randn(pool, 1, kv_heads, head_dim, device=device).to(torch.bfloat16)
    v_cache = torch.randn(pool, 1, kv_heads, head_dim, device=device).to(torch.bfloat16)
    lengths = _split(total, batch, device)
    kv_indptr = torch.cat([torch.zeros(1, dtype=torch.int64, device=device), lengths.cumsum(0)]).to(torch.int32)
    kv_indices = torch.randperm(pool, device=device)[:total].to(torch.int32)
    return [q, k_cache, v_cache, kv_indptr, kv_indices]


def reference(q, k_cache, v_cache, kv_indptr, kv_indices):
    compute = torch.promote_types(q.dtype, torch.float32)
    batch, heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    group = heads // kv_heads
    tokens = kv_indices.long()
    k = k_cache.reshape(-1, kv_heads, head_dim)[tokens].to(compute)
    v = v_cache.reshape(-1, kv_heads, head_dim)[tokens].to(compute)
    out = torch.empty(batch, heads, head_dim, dtype=compute, device=q.device)
    lse = torch.empty(batch, heads, dtype=compute, device=q.device)
    bounds = kv_indptr.tolist()
    for b in range(batch):
        kb, vb = k[bounds[b]:bounds[b + 1]], v[bounds[b]:bounds[b + 1]]
        qb = q[b].to(compute).view(kv_heads, group, head_dim)
        scores = torch.einsum("hgd,lhd->hgl", qb, kb) * SM_SCALE
        lse_b = torch.logsumexp(scores, dim=-1, keepdim=True)
        out[b] = torch.einsum("hgl,lhd->hgd", torch.exp(scores - lse_b), vb).reshape(heads, head_dim)
        lse[b] = lse_b.reshape(heads) / math.log(2.0)
    return out.to(q.dtype), lse
