"""GQA paged decode attention (page size 1, bf16): one query token per sequence over its KV pages kv_indices[kv_indptr[b]:kv_indptr[b+1]], logits scaled by sm_scale; return out (bf16) and the base-2 log-sum-exp of the scaled logits (fp32)."""
# Source: Llama-3.1-8B decode (32 q / 8 kv heads, head dim 128; query head h reads kv head h // 4)
# in the shape of the original MetaKernelBench p01, a captured FlashInfer-Bench workload: batch 64
# with the sequence lengths fixed by KV_INDPTR below (58,966 KV tokens), a pool of 68,237 pages,
# sm_scale 0.0883883461356163 (1/sqrt(128) rounded to fp32), passed as a Python float.
# Layout: q [64, 32, 128]; k_cache, v_cache [68237, 1, 8, 128] (NHD pages of one token); kv_indptr
# int32 [65] and kv_indices int32 [58966] (CSR page table, pages in token order).
# lse[b, h] = log2(sum_j exp(sm_scale * q.k_j)) (base 2, as paged-attention kernels return it for
# merging partial results). The reference loops over the sequences like the original's.
# Fixed: shapes, the lengths, pool size, sm_scale. Redrawn per draw: q, both caches ~ N(0, 1) and
# the page ids (distinct pages drawn at random from the pool).
import math

import torch

DTYPE = "bf16"
SOL = {
    "flops": 4 * 32 * 128 * 58966,
    "bytes": 2 * 64 * 32 * 128 + 2 * 2 * 58966 * 8 * 128 + 4 * 58966 + 4 * 65 + 2 * 64 * 32 * 128 + 4 * 64 * 32,
}

NUM_PAGES = 68237
KV_INDPTR = (0, 542, 1067, 1637, 2236, 3014, 3538, 4063, 4576, 5134, 5652, 6168, 6723, 7234, 7754, 8281, 9129,
             9707, 12277, 15364, 16907, 19227, 21549, 23026, 24599, 26116, 26643, 27348, 27869, 28398, 28921,
             29459, 29975, 30499, 31031, 31549, 32469, 33110, 33799, 34316, 34832, 35354, 35905, 36437, 36974,
             39857, 43029, 43851, 44373, 45273, 45915, 46427, 46950, 47501, 49996, 50527, 52650, 54239, 55046,
             55603, 56118, 56966, 57882, 58391, 58966)
SM_SCALE = 0.0883883461356163


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        indptr, heads, kv_heads, pool = KV_INDPTR, 32, 8, NUM_PAGES
    else:
        indptr, heads, kv_heads, pool = (0, 7, 8, 20), 8, 2, 40
    bf16 = torch.bfloat16
    q = torch.randn(len(indptr) - 1, heads, 128, device=device, dtype=bf16)
    k_cache = torch.randn(pool, 1, kv_heads, 128, device=device, dtype=bf16)
    v_cache = torch.randn(pool, 1, kv_heads, 128, device=device, dtype=bf16)
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
