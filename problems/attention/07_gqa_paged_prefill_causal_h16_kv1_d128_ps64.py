"""Causal GQA paged prefill attention (page size 64, bf16, 16 q heads sharing 1 kv head): ragged queries q[qo_indptr[b]:qo_indptr[b+1]] attend causally (aligned at the sequence end) to the pages kv_indices[kv_indptr[b]:kv_indptr[b+1]], the last holding kv_last_page_len[b] tokens, logits scaled by sm_scale; return out (bf16) and the base-2 LSE (fp32)."""
# Source: Qwen3-235B-A22B at tensor parallel 4 (64 q / 4 kv heads of 128 -> 16 q heads and 1 kv head
# per GPU) in the shape of the original MetaKernelBench p07, a captured FlashInfer-Bench workload: 15
# sequences whose query counts and page counts are both fixed by QO_INDPTR = KV_INDPTR below (969
# query tokens, 969 pages) with every last page holding 1 token, so sequence b has
# (pages_b - 1) * 64 + 1 keys (61,071 in all) of which its last q_len are the new tokens; a pool of
# 4,166 pages; sm_scale 1/sqrt(128) passed as a Python float.
# Layout: q [969, 16, 128]; k_cache, v_cache [4166, 64, 1, 128]; qo_indptr, kv_indptr int32 [16]
# (kv_indptr counts pages); kv_indices int32 [969]; kv_last_page_len int32 [15]. Query i sees keys
# j <= i + kv_len - q_len. lse[t, h] = log2(sum over visible j of exp(sm_scale * q_t.k_j)). The
# reference works through each sequence in chunks of 512 queries like the original's.
# Fixed: shapes, the lengths, pool size, sm_scale. Redrawn per draw: q, both caches ~ N(0, 1) and
# the page ids (distinct pages drawn at random from the pool).
import math

import torch

DTYPE = "bf16"
SOL = {
    "flops": 4 * 16 * 128 * 13099114,
    "bytes": 2 * 969 * 16 * 128 + 2 * 2 * 61071 * 1 * 128 + 4 * 969 + 2 * 4 * 16 + 4 * 15
    + 2 * 969 * 16 * 128 + 4 * 969 * 16,
}

CHUNK_Q = 512
NUM_PAGES = 4166
QO_INDPTR = (0, 17, 79, 172, 442, 458, 475, 480, 530, 540, 548, 595, 598, 610, 629, 969)
KV_INDPTR = QO_INDPTR
KV_LAST_PAGE_LEN = (1,) * 15
SM_SCALE = 0.08838834764831843


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        qo, kv, last, heads, page_size, pool = QO_INDPTR, KV_INDPTR, KV_LAST_PAGE_LEN, 16, 64, NUM_PAGES
    else:
        qo, kv, last, heads, page_size, pool = (0, 3, 4, 9), (0, 3, 4, 7), (1, 2, 3), 4, 4, 12
    bf16 = torch.bfloat16
    q = torch.randn(qo[-1], heads, 128, device=device, dtype=bf16)
    k_cache = torch.randn(pool, page_size, 1, 128, device=device, dtype=bf16)
    v_cache = torch.randn(pool, page_size, 1, 128, device=device, dtype=bf16)
    qo_indptr = torch.tensor(qo, device=device, dtype=torch.int32)
    kv_indptr = torch.tensor(kv, device=device, dtype=torch.int32)
    kv_indices = torch.randperm(pool, device=device)[:kv[-1]].to(torch.int32)
    kv_last_page_len = torch.tensor(last, device=device, dtype=torch.int32)
    return [q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, SM_SCALE]


def _causal_chunk(q, k, v, sm_scale, first, delta):
    """Queries first.. of one sequence (q [n, H, D]) against all its keys (k, v [m, KVH, D])."""
    n, heads, head_dim = q.shape
    m, kv_heads, _ = k.shape
    group = heads // kv_heads
    logits = torch.einsum("qhgd,khd->hgqk", q.view(n, kv_heads, group, head_dim), k) * sm_scale
    rows = torch.arange(first, first + n, device=q.device)[:, None] + delta
    logits = logits.masked_fill(torch.arange(m, device=q.device)[None, :] > rows, float("-inf"))
    lse = (torch.logsumexp(logits, dim=-1) / math.log(2.0)).permute(2, 0, 1).reshape(n, heads)
    out = torch.einsum("hgqk,khd->qhgd", torch.softmax(logits, dim=-1), v).reshape(n, heads, head_dim)
    return out, lse


def reference(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, sm_scale):
    compute = torch.promote_types(q.dtype, torch.float32)
    total_q, heads, head_dim = q.shape
    page_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
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
            o, l = _causal_chunk(q[rows].to(compute), k, v, sm_scale, first, kv_len - q_len)
            out[rows], lse[rows] = o.to(q.dtype), l
    return out, lse
