"""Causal GQA paged prefill attention (page size 1, bf16): ragged queries q[qo_indptr[b]:qo_indptr[b+1]] attend causally (aligned at the sequence end) to their pages kv_indices[kv_indptr[b]:kv_indptr[b+1]], logits scaled by sm_scale; return out (bf16) and the base-2 LSE per query and head (fp32)."""
# Source: Llama-3.2-3B prefill (24 q / 8 kv heads, head dim 128; query head h reads kv head h // 3)
# in the shape of the original MetaKernelBench p04, a captured FlashInfer-Bench workload: 27
# sequences with the lengths fixed by QO_INDPTR below (16,372 query = KV tokens: a fresh prefill,
# the new tokens' K/V already in their pages), a pool of 77,646 pages, sm_scale 1/sqrt(128) passed
# as a Python float.
# Layout: q [16372, 24, 128] (sequences back to back); k_cache, v_cache [77646, 1, 8, 128];
# qo_indptr, kv_indptr int32 [28]; kv_indices int32 [16372] (one page per token, in token order).
# Query i of a sequence with q_len queries and kv_len keys sees keys j <= i + kv_len - q_len.
# lse[t, h] = log2(sum over visible j of exp(sm_scale * q_t.k_j)). The reference works through each
# sequence in chunks of 512 queries like the original's.
# Fixed: shapes, the lengths, pool size, sm_scale. Redrawn per draw: q, both caches ~ N(0, 1) and
# the page ids (distinct pages drawn at random from the pool).
import math

import torch

DTYPE = "bf16"
SOL = {
    "flops": 4 * 24 * 128 * 6241731,
    "bytes": 2 * 16372 * 24 * 128 + 2 * 2 * 16372 * 8 * 128 + 4 * 16372 + 2 * 4 * 28
    + 2 * 16372 * 24 * 128 + 4 * 16372 * 24,
}

CHUNK_Q = 512
NUM_PAGES = 77646
QO_INDPTR = (0, 145, 311, 484, 886, 1222, 1568, 1908, 2250, 2695, 3049, 3595, 4042, 4555, 5093, 5638, 6413, 6974,
             7689, 8514, 9110, 10050, 11131, 12281, 13236, 14199, 15449, 16372)
KV_INDPTR = QO_INDPTR
SM_SCALE = 0.08838834764831843


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        qo, kv, heads, kv_heads, pool = QO_INDPTR, KV_INDPTR, 24, 8, NUM_PAGES
    else:
        qo, kv, heads, kv_heads, pool = (0, 5, 6, 15), (0, 5, 6, 15), 6, 2, 30
    bf16 = torch.bfloat16
    q = torch.randn(qo[-1], heads, 128, device=device, dtype=bf16)
    k_cache = torch.randn(pool, 1, kv_heads, 128, device=device, dtype=bf16)
    v_cache = torch.randn(pool, 1, kv_heads, 128, device=device, dtype=bf16)
    qo_indptr = torch.tensor(qo, device=device, dtype=torch.int32)
    kv_indptr = torch.tensor(kv, device=device, dtype=torch.int32)
    kv_indices = torch.randperm(pool, device=device)[:kv[-1]].to(torch.int32)
    return [q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, SM_SCALE]


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


def reference(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, sm_scale):
    compute = torch.promote_types(q.dtype, torch.float32)
    total_q, heads, head_dim = q.shape
    out = torch.empty(total_q, heads, head_dim, dtype=q.dtype, device=q.device)
    lse = torch.empty(total_q, heads, dtype=compute, device=q.device)
    qo, kv = qo_indptr.tolist(), kv_indptr.tolist()
    for b in range(len(qo) - 1):
        pages = kv_indices[kv[b]:kv[b + 1]].long()
        k, v = k_cache[pages, 0].to(compute), v_cache[pages, 0].to(compute)
        q_len = qo[b + 1] - qo[b]
        for first in range(0, q_len, CHUNK_Q):
            rows = slice(qo[b] + first, qo[b] + min(first + CHUNK_Q, q_len))
            o, l = _causal_chunk(q[rows].to(compute), k, v, sm_scale, first, k.shape[0] - q_len)
            out[rows], lse[rows] = o.to(q.dtype), l
    return out, lse
