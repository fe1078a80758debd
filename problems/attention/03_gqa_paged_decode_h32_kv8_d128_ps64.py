"""GQA paged decode attention (page size 64, bf16): one query token per sequence over the pages kv_indices[kv_indptr[b]:kv_indptr[b+1]], whose last page holds kv_last_page_len[b] tokens, logits scaled by sm_scale; return out (bf16) and the base-2 LSE of the scaled logits (fp32)."""
# Source: Llama-3.1-8B decode (32 q / 8 kv heads, head dim 128; query head h reads kv head h // 4)
# in the shape of the original MetaKernelBench p03, a captured FlashInfer-Bench workload: batch 64
# with the page counts fixed by KV_INDPTR below (27,222 pages) and, as captured, every last page
# holding 1 token (so sequence b has (pages_b - 1) * 64 + 1 tokens, ~1.74 M in all); a pool of
# 29,441 pages (3.9 GB per cache); sm_scale 1/sqrt(128), passed as a Python float.
# Layout: q [64, 32, 128]; k_cache, v_cache [29441, 64, 8, 128] (NHD pages of 64 tokens);
# kv_indptr int32 [65] and kv_indices int32 [27222] (CSR page table, pages in token order);
# kv_last_page_len int32 [64]. lse[b, h] = log2(sum_j exp(sm_scale * q.k_j)) (base 2). The
# reference loops over the sequences like the original's.
# Fixed: shapes, page counts, last-page lengths, pool size, sm_scale. Redrawn per draw: q, both
# caches ~ N(0, 1) and the page ids (distinct pages drawn at random from the pool).
import math

import torch

DTYPE = "bf16"
SOL = {
    "flops": 4 * 32 * 128 * ((27222 - 64) * 64 + 64),
    "bytes": 2 * 64 * 32 * 128 + 2 * 2 * ((27222 - 64) * 64 + 64) * 8 * 128 + 4 * 27222 + 4 * 65 + 4 * 64
    + 2 * 64 * 32 * 128 + 4 * 64 * 32,
}

NUM_PAGES = 29441
KV_INDPTR = (0, 46, 75, 149, 252, 534, 562, 591, 608, 670, 692, 712, 771, 786, 810, 841, 1193, 1275, 3349, 5940,
             6987, 8811, 10637, 11618, 12695, 13716, 13747, 13956, 13981, 14014, 14041, 14083, 14103, 14131, 14167,
             14189, 14613, 14758, 14951, 14972, 14992, 15018, 15073, 15109, 15150, 17537, 20213, 20539, 20565,
             20969, 21115, 21131, 21158, 21213, 23212, 23247, 24874, 25967, 26278, 26339, 26358, 26710, 27130,
             27143, 27222)
SM_SCALE = 0.08838834764831843


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        indptr, last, heads, kv_heads, page_size, pool = KV_INDPTR, (1,) * 64, 32, 8, 64, NUM_PAGES
    else:
        indptr, last, heads, kv_heads, page_size, pool = (0, 2, 3, 7), (1, 3, 4), 8, 2, 4, 12
    bf16 = torch.bfloat16
    q = torch.randn(len(indptr) - 1, heads, 128, device=device, dtype=bf16)
    k_cache = torch.randn(pool, page_size, kv_heads, 128, device=device, dtype=bf16)
    v_cache = torch.randn(pool, page_size, kv_heads, 128, device=device, dtype=bf16)
    kv_indptr = torch.tensor(indptr, device=device, dtype=torch.int32)
    kv_indices = torch.randperm(pool, device=device)[:indptr[-1]].to(torch.int32)
    kv_last_page_len = torch.tensor(last, device=device, dtype=torch.int32)
    return [q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, SM_SCALE]


def reference(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale):
    compute = torch.promote_types(q.dtype, torch.float32)
    batch, heads, head_dim = q.shape
    page_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = heads // kv_heads
    out = torch.empty(batch, heads, head_dim, dtype=q.dtype, device=q.device)
    lse = torch.empty(batch, heads, dtype=compute, device=q.device)
    bounds, last = kv_indptr.tolist(), kv_last_page_len.tolist()
    for b in range(batch):
        pages = kv_indices[bounds[b]:bounds[b + 1]].long()
        length = (pages.numel() - 1) * page_size + last[b]
        k = k_cache[pages].reshape(-1, kv_heads, head_dim)[:length].to(compute)
        v = v_cache[pages].reshape(-1, kv_heads, head_dim)[:length].to(compute)
        qb = q[b].to(compute).view(kv_heads, group, head_dim)
        logits = torch.einsum("hgd,lhd->hgl", qb, k) * sm_scale
        lse[b] = (torch.logsumexp(logits, dim=-1) / math.log(2.0)).reshape(heads)
        out[b] = torch.einsum("hgl,lhd->hgd", torch.softmax(logits, dim=-1), v).reshape(heads, head_dim).to(q.dtype)
    return out, lse
