"""GQA paged decode attention (page size 1, bf16, 5 q heads sharing 1 kv head): one query token per sequence over its KV pages kv_indices[kv_indptr[b]:kv_indptr[b+1]], logits scaled by sm_scale; return out (bf16) and the base-2 log-sum-exp of the scaled logits (fp32)."""
# Source: Llama-4-Scout-17B-16E at tensor parallel 8 (40 q / 8 kv heads of 128 -> 5 q heads and 1 kv
# head per GPU; the attention core only: RoPE/NoPE and query temperature scaling come before it)
# in the shape of the original MetaKernelBench p02, a captured FlashInfer-Bench workload: batch 63
# with the sequence lengths fixed by KV_INDPTR below (19,134 KV tokens), a pool of 53,173 pages,
# sm_scale 1/sqrt(128), passed as a Python float.
# Layout: q [63, 5, 128]; k_cache, v_cache [53173, 1, 1, 128] (NHD pages of one token); kv_indptr
# int32 [64] and kv_indices int32 [19134] (CSR page table, pages in token order).
# lse[b, h] = log2(sum_j exp(sm_scale * q.k_j)) (base 2). The reference loops over the sequences
# like the original's.
# Fixed: shapes, the lengths, pool size, sm_scale. Redrawn per draw: q, both caches ~ N(0, 1) and
# the page ids (distinct pages drawn at random from the pool).
import math

import torch

DTYPE = "bf16"
SOL = {
    "flops": 4 * 5 * 128 * 19134,
    "bytes": 2 * 63 * 5 * 128 + 2 * 2 * 19134 * 1 * 128 + 4 * 19134 + 4 * 64 + 2 * 63 * 5 * 128 + 4 * 63 * 5,
}

NUM_PAGES = 53173
KV_INDPTR = (0, 20, 28, 98, 102, 124, 147, 160, 193, 198, 207, 230, 266, 282, 397, 410, 418, 450, 461, 486, 508,
             814, 1084, 1335, 1412, 1462, 1485, 1496, 1502, 1938, 1955, 2275, 2297, 2313, 2332, 2382, 2390, 2405,
             2414, 2568, 2578, 2586, 2597, 4650, 4660, 4760, 4781, 4932, 4940, 4968, 5043, 5054, 5070, 5124,
             10265, 15933, 15946, 16069, 16081, 17894, 19017, 19040, 19118, 19134)
SM_SCALE = 0.08838834764831843


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        indptr, pool = KV_INDPTR, NUM_PAGES
    else:
        indptr, pool = (0, 7, 8, 20), 40
    bf16 = torch.bfloat16
    q = torch.randn(len(indptr) - 1, 5, 128, device=device, dtype=bf16)
    k_cache = torch.randn(pool, 1, 1, 128, device=device, dtype=bf16)
    v_cache = torch.randn(pool, 1, 1, 128, device=device, dtype=bf16)
    kv_indptr = torch.tensor(indptr, device=device, dtype=torch.int32)
    kv_indices = torch.randperm(pool, device=device)[:indptr[-1]].to(torch.int32)
    return [q, k_cache, v_cache, kv_indptr, kv_indices, SM_SCALE]


def reference(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale):
    compute = torch.promote_types(q.dtype, torch.float32)
    batch, heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    group = heads // kv_heads
    out = torch.empty(batch, heads, head_dim, dtype=q.dtype, device=q.device)
    lse = torch.empty(batch, heads, dtype=compute, device=q.device)
    bounds = kv_indptr.tolist()
    for b in range(batch):
        pages = kv_indices[bounds[b]:bounds[b + 1]].long()
        k = k_cache[pages, 0].to(compute)
        v = v_cache[pages, 0].to(compute)
        qb = q[b].to(compute).view(kv_heads, group, head_dim)
        logits = torch.einsum("hgd,lhd->hgl", qb, k) * sm_scale
        lse[b] = (torch.logsumexp(logits, dim=-1) / math.log(2.0)).reshape(heads)
        out[b] = torch.einsum("hgl,lhd->hgd", torch.softmax(logits, dim=-1), v).reshape(heads, head_dim).to(q.dtype)
    return out, lse
