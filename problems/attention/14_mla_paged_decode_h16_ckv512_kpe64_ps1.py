"""Absorbed MLA paged decode (page size 1, bf16): logits = (q_nope.ckv + q_pe.kpe) * sm_scale over each sequence's pages kv_indices[kv_indptr[b]:kv_indptr[b+1]], out = softmax(logits) @ ckv; return out (bf16) and the base-2 LSE of the scaled logits (fp32)."""
# Source: DeepSeek-V3 at tensor parallel 8 (128 heads -> 16 per GPU; kv_lora_rank 512,
# qk_rope_head_dim 64) in the weight-absorbed decode form: every head attends over one shared latent
# cache (compressed kv, 512) plus a shared rope key (64), and the output stays in the latent space.
# Shape of the original MetaKernelBench p14, a captured FlashInfer-Bench workload: batch 64 with the
# sequence lengths fixed by KV_INDPTR below (75,145 KV tokens), a pool of 989,669 pages (1.1 GB of
# cache), sm_scale 0.1352337747812271 = mscale^2 / sqrt(192) with DeepSeek's YaRN mscale
# 0.1 ln(40) + 1, passed as a Python float.
# Layout: q_nope [64, 16, 512], q_pe [64, 16, 64]; ckv_cache [989669, 1, 512] and kpe_cache
# [989669, 1, 64] (one token per page); kv_indptr int32 [65], kv_indices int32 [75145] (CSR page
# table in token order). lse[b, h] = log2(sum_j exp(logit_j)) (base 2). The reference loops over the
# sequences like the original's.
# Fixed: shapes, the lengths, pool size, sm_scale. Redrawn per draw: q_nope, q_pe, both caches ~
# N(0, 1); the page ids (distinct pages drawn at random from the pool).
import math

import torch

DTYPE = "bf16"
SOL = {
    "flops": 2 * 75145 * 16 * (512 + 64 + 512),
    "bytes": 2 * 64 * 16 * 576 + 2 * 75145 * 576 + 4 * 75145 + 4 * 65 + 2 * 64 * 16 * 512 + 4 * 64 * 16,
}

NUM_PAGES = 989669
KV_INDPTR = (0, 537, 1051, 1689, 2199, 3771, 5311, 6904, 8494, 11155, 13258, 15676, 24873, 25427, 25946, 27825,
             28517, 29331, 30010, 30680, 31220, 31736, 32254, 32866, 33378, 36677, 37310, 37846, 38896, 39415,
             39983, 40641, 41155, 41689, 42417, 43059, 43975, 45419, 47001, 48634, 50171, 51682, 52311, 53407,
             54908, 56394, 57906, 58425, 58975, 59915, 60483, 61003, 64016, 64571, 65094, 66520, 67099, 67743,
             68267, 68784, 69317, 70745, 72061, 73455, 75145)
SM_SCALE = 0.1352337747812271


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        indptr, heads, pool = KV_INDPTR, 16, NUM_PAGES
    else:
        indptr, heads, pool = (0, 7, 8, 20), 4, 50
    bf16 = torch.bfloat16
    q_nope = torch.randn(len(indptr) - 1, heads, 512, device=device, dtype=bf16)
    q_pe = torch.randn(len(indptr) - 1, heads, 64, device=device, dtype=bf16)
    ckv_cache = torch.randn(pool, 1, 512, device=device, dtype=bf16)
    kpe_cache = torch.randn(pool, 1, 64, device=device, dtype=bf16)
    kv_indptr = torch.tensor(indptr, device=device, dtype=torch.int32)
    kv_indices = torch.randperm(pool, device=device)[:indptr[-1]].to(torch.int32)
    return [q_nope, q_pe, ckv_cache, kpe_cache, kv_indptr, kv_indices, SM_SCALE]


def reference(q_nope, q_pe, ckv_cache, kpe_cache, kv_indptr, kv_indices, sm_scale):
    compute = torch.promote_types(q_nope.dtype, torch.float32)
    batch, heads, rank = q_nope.shape
    out = torch.empty(batch, heads, rank, dtype=q_nope.dtype, device=q_nope.device)
    lse = torch.empty(batch, heads, dtype=compute, device=q_nope.device)
    bounds = kv_indptr.tolist()
    for b in range(batch):
        pages = kv_indices[bounds[b]:bounds[b + 1]].long()
        ckv, kpe = ckv_cache[pages, 0].to(compute), kpe_cache[pages, 0].to(compute)
        logits = (q_nope[b].to(compute) @ ckv.T + q_pe[b].to(compute) @ kpe.T) * sm_scale
        lse[b] = torch.logsumexp(logits, dim=-1) / math.log(2.0)
        out[b] = (torch.softmax(logits, dim=-1) @ ckv).to(q_nope.dtype)
    return out, lse
