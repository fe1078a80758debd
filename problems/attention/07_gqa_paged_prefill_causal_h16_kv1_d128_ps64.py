"""Causal GQA paged prefill attention (page size 64, bf16, 16 q heads sharing 1 kv head): ragged queries q[qo_indptr[b]:qo_indptr[b+1]] attend causally (aligned at the sequence end) to the pages kv_indices[kv_indptr[b]:kv_indptr[b+1]], the last holding kv_last_page_len[b] tokens; return out (bf16)."""
# Source: Qwen3-235B-A22B config.json: num_attention_heads 64, num_key_value_heads 4, head_dim 128;
# tensor parallel 4 gives 16 query heads and 1 kv head per GPU. Softmax scale 1/sqrt(128).
# Layout: q [total_q, 16, 128] (sequences packed back to back); k_cache, v_cache
# [num_pages, 64, 1, 128]; qo_indptr, kv_indptr int32 [batch + 1] (kv_indptr counts pages);
# kv_indices int32 [total pages] (in token order); kv_last_page_len int32 [batch], so sequence b has
# kv_len = (pages_b - 1) * 64 + kv_last_page_len[b] keys, the last q_len of which are its new tokens;
# query i sees keys j <= i + kv_len - q_len.
# Workload: 15 sequences extending cached contexts (multi-turn / chunked prefill): 969 new query
# tokens (1..239 per sequence), 165,910 KV tokens in 2,600 pages (661..28,882 keys per sequence),
# lengths fixed below; pool of 4,166 pages. The slot gave no KV length; about 60% of the pool is
# used. Fixed: shapes, lengths, pool size. Redrawn per draw: q, both caches ~ N(0, 1) and the page
# ids (distinct pages drawn at random from the pool).
import math

import torch

DTYPE = "bf16"
SOL = {
    "flops": 4 * 16 * 128 * 13746135,
    "bytes": 2 * 969 * 16 * 128 + 2 * 2 * 165910 * 1 * 128 + 4 * 2600 + 2 * 4 * 16 + 4 * 15
    + 2 * 969 * 16 * 128,
}

SM_SCALE = 1.0 / math.sqrt(128)
Q_LENS = [12, 7, 220, 12, 5, 129, 47, 108, 78, 32, 3, 1, 61, 15, 239]
KV_LENS = [2168, 20847, 28882, 28015, 661, 12806, 18251, 23185, 743, 3146, 7180, 5876, 7418, 1372, 5360]


def _indptr(lengths, device):
    return torch.tensor([0] + lengths, device=device).cumsum(0).to(torch.int32)


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        q_lens, kv_lens, heads, kv_heads, head_dim, page_size, pool = Q_LENS, KV_LENS, 16, 1, 128, 64, 4166
    else:
        q_lens, kv_lens, heads, kv_heads, head_dim, page_size, pool = [5, 1, 9], [13, 4, 9], 4, 1, 128, 4, 12
    pages = [-(-n // page_size) for n in kv_lens]
    q = torch.randn(sum(q_lens), heads, head_dim, device=device).to(torch.bfloat16)
    k_cache = torch.randn(pool, page_size, kv_heads, head_dim, device=device).to(torch.bfloat16)
    v_cache = torch.randn(pool, page_size, kv_heads, head_dim, device=device).to(torch.bfloat16)
    qo_indptr = _indptr(q_lens, device)
    kv_indptr = _indptr(pages, device)
    kv_indices = torch.randperm(pool, device=device)[:sum(pages)].to(torch.int32)
    kv_last_page_len = torch.tensor([n - (p - 1) * page_size for n, p in zip(kv_lens, pages)],
                                    dtype=torch.int32, device=device)
    return [q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len]


def reference(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    compute = torch.promote_types(q.dtype, torch.float32)
    total_q, heads, head_dim = q.shape
    page_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = heads // kv_heads
    out = torch.empty(total_q, heads, head_dim, dtype=compute, device=q.device)
    qo, kv, last = qo_indptr.tolist(), kv_indptr.tolist(), kv_last_page_len.tolist()
    for b in range(len(qo) - 1):
        pages = kv_indices[kv[b]:kv[b + 1]].long()
        q_len, kv_len = qo[b + 1] - qo[b], (len(pages) - 1) * page_size + last[b]
        kb = k_cache[pages].reshape(-1, kv_heads, head_dim)[:kv_len].to(compute)
        vb = v_cache[pages].reshape(-1, kv_heads, head_dim)[:kv_len].to(compute)
        qb = q[qo[b]:qo[b + 1]].to(compute).view(q_len, kv_heads, group, head_dim)
        scores = torch.einsum("qhgd,khd->hgqk", qb, kb) * SM_SCALE
        rows = torch.arange(q_len, device=q.device)[:, None] + (kv_len - q_len)
        scores = scores.masked_fill(torch.arange(kv_len, device=q.device)[None, :] > rows, float("-inf"))
        ob = torch.einsum("hgqk,khd->qhgd", torch.softmax(scores, dim=-1), vb)
        out[qo[b]:qo[b + 1]] = ob.reshape(q_len, heads, head_dim)
    return out.to(q.dtype)
