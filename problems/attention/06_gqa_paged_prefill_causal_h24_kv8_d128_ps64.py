"""Causal GQA paged prefill attention (page size 64, bf16): ragged queries q[qo_indptr[b]:qo_indptr[b+1]] attend causally (aligned at the sequence end) to the pages kv_indices[kv_indptr[b]:kv_indptr[b+1]], the last holding kv_last_page_len[b] tokens, logits scaled by sm_scale; return out (bf16) and the base-2 LSE per query and head (fp32)."""
# Source: Llama-3.2-3B (24 q / 8 kv heads, head dim 128; query head h reads kv head h // 3) in the
# shape of the original MetaKernelBench p06, a captured FlashInfer-Bench workload: 15 sequences
# whose query counts and page counts are both fixed by QO_INDPTR = KV_INDPTR below (6,069 query
# tokens, 6,069 pages) with every last page holding 1 token, so sequence b has (pages_b - 1) * 64 + 1
# keys (387,471 in all) of which its last q_len are the new tokens (a chunked prefill on top of a
# long cached context); a pool of 32,757 pages (4.3 GB per cache); sm_scale 1/sqrt(128) passed as a
# Python float.
# Layout: q [6069, 24, 128]; k_cache, v_cache [32757, 64, 8, 128]; qo_indptr, kv_indptr int32 [16]
# (kv_indptr counts pages); kv_indices int32 [6069] (pages in token order); kv_last_page_len int32
# [15]. Query i sees keys j <= i + kv_len - q_len. lse[t, h] = log2(sum over visible j of
# exp(sm_scale * q_t.k_j)). The reference works through each sequence in chunks of 512 queries and,
# inside a chunk, one kv head at a time, like the original's.
# Fixed: shapes, the lengths, pool size, sm_scale. Redrawn per draw: q, both caches ~ N(0, 1) and
# the page ids (distinct pages drawn at random from the pool).
import math

import torch

DTYPE = "bf16"
SOL = {
    "flops": 4 * 24 * 128 * 174908183,
    "bytes": 2 * 6069 * 24 * 128 + 2 * 2 * 387471 * 8 * 128 + 4 * 6069 + 2 * 4 * 16 + 4 * 15
    + 2 * 6069 * 24 * 128 + 4 * 6069 * 24,
}

CHUNK_Q = 512
NUM_PAGES = 32757
QO_INDPTR = (0, 206, 373, 612, 836, 1112, 1442, 1938, 2411, 2963, 3408, 3939, 4463, 4999, 5601, 6069)
KV_INDPTR = QO_INDPTR
KV_LAST_PAGE_LEN = (1,) * 15
SM_SCALE = 0.08838834764831843


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        qo, kv, last, heads, kv_heads, page_size, pool = QO_INDPTR, KV_INDPTR, KV_LAST_PAGE_LEN, 24, 8, 64, NUM_PAGES
    else:
        qo, kv, last, heads, kv_heads, page_size, pool = (0, 3, 4, 9), (0, 3, 4, 7), (1, 2, 3), 6, 2, 4, 12
    bf16 = torch.bfloat16
    q = torch.randn(qo[-1], heads, 128, device=device, dtype=bf16)
    k_cache = torch.randn(pool, page_size, kv_heads, 128, device=device, dtype=bf16)
    v_cache = torch.randn(pool, page_size, kv_heads, 128, device=device, dtype=bf16)
    qo_indptr = torch.tensor(qo, device=device, dtype=torch.int32)
    kv_indptr = torch.tensor(kv, device=device, dtype=torch.int32)
    kv_indices = torch.randperm(pool, device=device)[:kv[-1]].to(torch.int32)
    kv_last_page_len = torch.tensor(last, device=device, dtype=torch.int32)
    return [q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, SM_SCALE]


def reference(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, sm_scale):
    compute = torch.promote_types(q.dtype, torch.float32)
    total_q, heads, head_dim = q.shape
    page_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = heads // kv_heads
    out = torch.empty(total_q, heads, head_dim, dtype=q.dtype, device=q.device)
    lse = torch.empty(total_q, heads, dtype=compute, device=q.device)
    qo, kv, last = qo_indptr.tolist(), kv_indptr.tolist(), kv_last_page_len.tolist()
    for b in range(len(qo) - 1):
        pages = kv_indices[kv[b]:kv[b + 1]].long()
        kv_len = (pages.numel() - 1) * page_size + last[b]
        k = k_cache[pages].reshape(-1, kv_heads, head_dim)[:kv_len].to(compute)
        v = v_cache[pages].reshape(-1, kv_heads, head_dim)[:kv_len].to(compute)
        q_len = qo[b + 1] - qo[b]
        for first in range(0, q_len, CHUNK_Q):
            rows = slice(qo[b] + first, qo[b] + min(first + CHUNK_Q, q_len))
            qc = q[rows].to(compute)
            hidden = (torch.arange(kv_len, device=q.device)[None, :]
                      > torch.arange(first, first + qc.shape[0], device=q.device)[:, None] + (kv_len - q_len))
            for h in range(kv_heads):
                heads_of = slice(h * group, (h + 1) * group)
                logits = torch.einsum("qgd,kd->qgk", qc[:, heads_of], k[:, h]) * sm_scale
                logits = logits.masked_fill(hidden[:, None, :], float("-inf"))
                lse[rows, heads_of] = torch.logsumexp(logits, dim=-1) / math.log(2.0)
                out[rows, heads_of] = torch.einsum("qgk,kd->qgd", torch.softmax(logits, dim=-1), v[:, h]).to(q.dtype)
    return out, lse
