"""Causal GQA paged prefill attention (page size 1, bf16, 5 q heads sharing 1 kv head): ragged queries q[qo_indptr[b]:qo_indptr[b+1]] attend causally (aligned at the sequence end) to the pages kv_indices[kv_indptr[b]:kv_indptr[b+1]], logits scaled by sm_scale; return out (bf16) and the base-2 LSE per query and head (fp32)."""
# Source: Llama-4-Scout-17B-16E at tensor parallel 8 (5 q heads and 1 kv head of 128 per GPU; the
# attention core only) in the shape of the original MetaKernelBench p05, a captured FlashInfer-Bench
# workload: 54 sequences with the lengths fixed by QO_INDPTR / KV_INDPTR below (10,847 query and
# 10,945 KV tokens; most sequences continue a short cached prefix; the last has 5,139 queries), a
# pool of 44,264 pages, sm_scale 1/sqrt(128) passed as a Python float.
# Layout: q [10847, 5, 128] (sequences back to back); k_cache, v_cache [44264, 1, 1, 128];
# qo_indptr, kv_indptr int32 [55]; kv_indices int32 [10945] (one page per token, in token order).
# Query i of a sequence with q_len queries and kv_len keys sees keys j <= i + kv_len - q_len.
# lse[t, h] = log2(sum over visible j of exp(sm_scale * q_t.k_j)). The reference handles each
# sequence whole, like the original's.
# Fixed: shapes, the lengths, pool size, sm_scale. Redrawn per draw: q, both caches ~ N(0, 1) and
# the page ids (distinct pages drawn at random from the pool).
import math

import torch

DTYPE = "bf16"
SOL = {
    "flops": 4 * 5 * 128 * 15914769,
    "bytes": 2 * 10847 * 5 * 128 + 2 * 2 * 10945 * 1 * 128 + 4 * 10945 + 2 * 4 * 55
    + 2 * 10847 * 5 * 128 + 4 * 10847 * 5,
}

NUM_PAGES = 44264
QO_INDPTR = (0, 5, 73, 74, 94, 113, 124, 153, 156, 162, 182, 216, 229, 338, 347, 353, 380, 389, 412, 432, 735,
             1002, 1250, 1325, 1373, 1394, 1402, 1406, 1840, 1855, 2171, 2191, 2205, 2222, 2270, 2274, 2286, 2292,
             2441, 2448, 2454, 2462, 3211, 5262, 5269, 5364, 5383, 5531, 5537, 5563, 5636, 5645, 5656, 5708, 10847)
KV_INDPTR = (0, 7, 76, 79, 100, 122, 134, 166, 170, 178, 200, 235, 250, 364, 376, 383, 414, 424, 448, 469, 774,
             1043, 1293, 1369, 1418, 1440, 1450, 1455, 1890, 1906, 2225, 2246, 2261, 2279, 2328, 2335, 2349, 2357,
             2510, 2519, 2526, 2536, 3289, 5341, 5350, 5449, 5469, 5619, 5626, 5653, 5727, 5737, 5752, 5805, 10945)
SM_SCALE = 0.08838834764831843


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        qo, kv, pool = QO_INDPTR, KV_INDPTR, NUM_PAGES
    else:
        qo, kv, pool = (0, 5, 6, 15), (0, 5, 9, 20), 30
    bf16 = torch.bfloat16
    q = torch.randn(qo[-1], 5, 128, device=device, dtype=bf16)
    k_cache = torch.randn(pool, 1, 1, 128, device=device, dtype=bf16)
    v_cache = torch.randn(pool, 1, 1, 128, device=device, dtype=bf16)
    qo_indptr = torch.tensor(qo, device=device, dtype=torch.int32)
    kv_indptr = torch.tensor(kv, device=device, dtype=torch.int32)
    kv_indices = torch.randperm(pool, device=device)[:kv[-1]].to(torch.int32)
    return [q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, SM_SCALE]


def reference(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, sm_scale):
    compute = torch.promote_types(q.dtype, torch.float32)
    total_q, heads, head_dim = q.shape
    out = torch.empty(total_q, heads, head_dim, dtype=q.dtype, device=q.device)
    lse = torch.empty(total_q, heads, dtype=compute, device=q.device)
    qo, kv = qo_indptr.tolist(), kv_indptr.tolist()
    for b in range(len(qo) - 1):
        pages = kv_indices[kv[b]:kv[b + 1]].long()
        k, v = k_cache[pages, 0, 0].to(compute), v_cache[pages, 0, 0].to(compute)
        qs = q[qo[b]:qo[b + 1]].to(compute)
        n, m = qs.shape[0], k.shape[0]
        logits = torch.einsum("qhd,kd->qhk", qs, k) * sm_scale
        visible = torch.arange(m, device=q.device)[None, :] <= torch.arange(n, device=q.device)[:, None] + (m - n)
        logits = logits.masked_fill(~visible[:, None, :], float("-inf"))
        lse[qo[b]:qo[b + 1]] = torch.logsumexp(logits, dim=-1) / math.log(2.0)
        out[qo[b]:qo[b + 1]] = torch.einsum("qhk,kd->qhd", torch.softmax(logits, dim=-1), v).to(q.dtype)
    return out, lse
