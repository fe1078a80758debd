"""GQA paged decode attention (page size 64, bf16): one query token per sequence over the pages kv_indices[kv_indptr[b]:kv_indptr[b+1]], whose last page holds kv_last_page_len[b] tokens; return out (bf16) and the base-2 LSE of the scaled scores (fp32)."""
# Source: Llama-3.1-8B config.json: num_attention_heads 32, num_key_value_heads 8, hidden_size 4096
# (head dim 128); query head h reads kv head h // 4. Softmax scale 1/sqrt(128).
# Layout: q [batch, 32, 128]; k_cache, v_cache [num_pages, 64, 8, 128] (NHD pages of 64 tokens);
# kv_indptr int32 [batch + 1] and kv_indices int32 [total pages] (CSR page table, pages in token
# order); kv_last_page_len int32 [batch] in 1..64, so sequence b holds
# (pages_b - 1) * 64 + kv_last_page_len[b] tokens. lse[b, h] = log2(sum_j exp(sm_scale * q.k_j)).
# Workload: batch 64 long-context decode requests holding 27,222 pages in all (pages per sequence a
# random split of the total, each >= 1; ~1.74 M KV tokens, ~27 k per sequence) from a pool of
# 29,441 pages (3.9 GB per cache). Change from the slot: its traces had every last page holding
# exactly 1 token; here kv_last_page_len is redrawn in 1..64 so that a kernel must honour it (SOL
# uses the expected 32.5 tokens for the last pages).
# Fixed: shapes, total pages, pool size. Redrawn per draw: q, both caches ~ N(0, 1); pages per
# sequence, last-page lengths, and the page ids (distinct pages drawn at random from the pool).
import math

import torch

DTYPE = "bf16"
SOL = {
    "flops": 4 * 32 * 128 * ((27222 - 64) * 64 + 2080),
    "bytes": 2 * 64 * 32 * 128 + 2 * 2 * ((27222 - 64) * 64 + 2080) * 8 * 128 + 4 * 27222 + 4 * 65 + 4 * 64
    + 2 * 64 * 32 * 128 + 4 * 64 * 32,
}

SM_SCALE = 1.0 / math.sqrt(128)


def _split(total, parts, device):
    """Random counts >= 1 that sum to total."""
    cuts = torch.randperm(total - 1, device=device)[: parts - 1] + 1
    bounds = torch.cat([torch.zeros(1, dtype=torch.int64, device=device), cuts.sort().values,
                        torch.full((1,), total, dtype=torch.int64, device=device)])
    return bounds.diff()


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        batch, heads, kv_heads, head_dim, page_size, total_pages, pool = 64, 32, 8, 128, 64, 27222, 29441
    else:
        batch, heads, kv_heads, head_dim, page_size, total_pages, pool = 3, 4, 2, 128, 4, 7, 12
    q = torch.randn(batch, heads, head_dim, device=device).to(torch.bfloat16)
    k_cache = torch.randn(pool, page_size, kv_heads, head_dim, device=device).to(torch.bfloat16)
    v_cache = torch.randn(pool, page_size, kv_heads, head_dim, device=device).to(torch.bfloat16)
    pages = _split(total_pages, batch, device)
    kv_indptr = torch.cat([torch.zeros(1, dtype=torch.int64, device=device), pages.cumsum(0)]).to(torch.int32)
    kv_indices = torch.randperm(pool, device=device)[:total_pages].to(torch.int32)
    kv_last_page_len = torch.randint(1, page_size + 1, (batch,), device=device, dtype=torch.int32)
    return [q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len]


def reference(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len):
    compute = torch.promote_types(q.dtype, torch.float32)
    batch, heads, head_dim = q.shape
    page_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = heads // kv_heads
    out = torch.empty(batch, heads, head_dim, dtype=compute, device=q.device)
    lse = torch.empty(batch, heads, dtype=compute, device=q.device)
    bounds, last = kv_indptr.tolist(), kv_last_page_len.tolist()
    for b in range(batch):
        pages = kv_indices[bounds[b]:bounds[b + 1]].long()
        length = (len(pages) - 1) * page_size + last[b]
        kb = k_cache[pages].reshape(-1, kv_heads, head_dim)[:length].to(compute)
        vb = v_cache[pages].reshape(-1, kv_heads, head_dim)[:length].to(compute)
        qb = q[b].to(compute).view(kv_heads, group, head_dim)
        scores = torch.einsum("hgd,lhd->hgl", qb, kb) * SM_SCALE
        lse_b = torch.logsumexp(scores, dim=-1, keepdim=True)
        out[b] = torch.einsum("hgl,lhd->hgd", torch.exp(scores - lse_b), vb).reshape(heads, head_dim)
        lse[b] = lse_b.reshape(heads) / math.log(2.0)
    return out.to(q.dtype), lse
