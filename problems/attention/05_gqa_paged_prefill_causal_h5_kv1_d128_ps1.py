"""Causal GQA paged prefill attention (page size 1, bf16, 5 q heads sharing 1 kv head): ragged queries q[qo_indptr[b]:qo_indptr[b+1]] attend causally (aligned at the sequence end) to the pages kv_indices[kv_indptr[b]:kv_indptr[b+1]]; return out (bf16)."""
# Source: Llama-4-Scout-17B-16E config.json: num_attention_heads 40, num_key_value_heads 8, head_dim
# 128; tensor parallel 8 gives 5 query heads and 1 kv head per GPU. Softmax scale 1/sqrt(128). The
# attention core only (RoPE/NoPE and query temperature scaling happen before it; no chunked window).
# Layout: q [total_q, 5, 128] (sequences packed back to back); k_cache, v_cache
# [num_pages, page_size=1, 1, 128]; qo_indptr, kv_indptr int32 [batch + 1]; kv_indices int32
# [total kv tokens] (one page per token, in token order). A few sequences continue from a cached
# prefix (kv_len = prefix + q_len); query i sees keys j <= i + kv_len - q_len.
# Workload: 54 sequences, 10,847 query tokens and 10,945 KV tokens (6 sequences with prefixes of
# 3..27 tokens), lengths fixed below; pool of 44,264 pages. Fixed: shapes, lengths, pool size.
# Redrawn per draw: q, both caches ~ N(0, 1) and the page ids (distinct pages drawn at random).
import math

import torch

DTYPE = "bf16"
SOL = {
    "flops": 4 * 5 * 128 * 2074994,
    "bytes": 2 * 10847 * 5 * 128 + 2 * 2 * 10945 * 1 * 128 + 4 * 10945 + 2 * 4 * 55 + 2 * 10847 * 5 * 128,
}

SM_SCALE = 1.0 / math.sqrt(128)
Q_LENS = [319, 82, 648, 65, 106, 106, 92, 44, 99, 74, 493, 482, 124, 67, 36, 222, 47, 188, 167, 277, 131,
          83, 234, 78, 131, 18, 377, 344, 56, 15, 14, 149, 532, 368, 112, 345, 270, 80, 412, 103, 47, 222,
          22, 482, 916, 71, 243, 558, 313, 42, 129, 68, 65, 79]
PREFIX_LENS = [0] * 25 + [19] + [0] * 7 + [13, 3] + [0] * 5 + [27, 0, 11] + [0] * 4 + [25] + [0] * 6


def _indptr(lengths, device):
    return torch.tensor([0] + lengths, device=device).cumsum(0).to(torch.int32)


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        q_lens, prefix_lens, heads, kv_heads, head_dim, pool = Q_LENS, PREFIX_LENS, 5, 1, 128, 44264
    else:
        q_lens, prefix_lens, heads, kv_heads, head_dim, pool = [5, 1, 9], [0, 3, 2], 5, 1, 128, 30
    kv_lens = [n + p for n, p in zip(q_lens, prefix_lens)]
    q = torch.randn(sum(q_lens), heads, head_dim, device=device).to(torch.bfloat16)
    k_cache = torch.randn(pool, 1, kv_heads, head_dim, device=device).to(torch.bfloat16)
    v_cache = torch.randn(pool, 1, kv_heads, head_dim, device=device).to(torch.bfloat16)
    qo_indptr = _indptr(q_lens, device)
    kv_indptr = _indptr(kv_lens, device)
    kv_indices = torch.randperm(pool, device=device)[:sum(kv_lens)].to(torch.int32)
    return [q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices]


def reference(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices):
    compute = torch.promote_types(q.dtype, torch.float32)
    total_q, heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    group = heads // kv_heads
    out = torch.empty(total_q, heads, head_dim, dtype=compute, device=q.device)
    qo, kv = qo_indptr.tolist(), kv_indptr.tolist()
    for b in range(len(qo) - 1):
        q_len, kv_len = qo[b + 1] - qo[b], kv[b + 1] - kv[b]
        pages = kv_indices[kv[b]:kv[b + 1]].long()
        kb = k_cache[pages].reshape(kv_len, kv_heads, head_dim).to(compute)
        vb = v_cache[pages].reshape(kv_len, kv_heads, head_dim).to(compute)
        qb = q[qo[b]:qo[b + 1]].to(compute).view(q_len, kv_heads, group, head_dim)
        scores = torch.einsum("qhgd,khd->hgqk", qb, kb) * SM_SCALE
        rows = torch.arange(q_len, device=q.device)[:, None] + (kv_len - q_len)
        scores = scores.masked_fill(torch.arange(kv_len, device=q.device)[None, :] > rows, float("-inf"))
        ob = torch.einsum("hgqk,khd->qhgd", torch.softmax(scores, dim=-1), vb)
        out[qo[b]:qo[b + 1]] = ob.reshape(q_len, heads, head_dim)
    return out.to(q.dtype)
