"""Causal absorbed MLA paged prefill (page size 1, bf16): each query of q_nope/q_pe[qo_indptr[b]:qo_indptr[b+1]] attends causally (aligned at the sequence end) to its sequence's pages kv_indices[kv_indptr[b]:kv_indptr[b+1]] with logits (q_nope.ckv + q_pe.kpe) * sm_scale, out = softmax @ ckv; return out (bf16) and the base-2 LSE (fp32)."""
# Source: DeepSeek-V3 at tensor parallel 8 (16 heads per GPU; kv_lora_rank 512, qk_rope_head_dim
# 64) in the weight-absorbed form: every head attends over one shared latent cache (512) plus a
# shared rope key (64), the output stays in the latent space. Shape of the original
# MetaKernelBench p15, a captured FlashInfer-Bench workload: 28 sequences with the lengths fixed by
# QO_INDPTR / KV_INDPTR below (1,954 query and 2,044 KV tokens; each sequence continues a short
# cached prefix), a pool of 989,669 pages, sm_scale 0.1352337747812271 (YaRN mscale^2 / sqrt(192)),
# passed as a Python float.
# Layout: q_nope [1954, 16, 512], q_pe [1954, 16, 64]; ckv_cache [989669, 1, 512], kpe_cache
# [989669, 1, 64]; qo_indptr, kv_indptr int32 [29]; kv_indices int32 [2044] (one page per token, in
# token order). Query i of a sequence sees keys j <= i + kv_len - q_len. lse[t, h] = log2(sum over
# visible j of exp(logit)). The reference goes query by query, like the original's.
# Fixed: shapes, the lengths, pool size, sm_scale. Redrawn per draw: q_nope, q_pe, both caches ~
# N(0, 1); the page ids (distinct pages drawn at random from the pool).
import math

import torch

DTYPE = "bf16"
SOL = {
    "flops": 2 * 16 * (512 + 64 + 512) * 220406,
    "bytes": 2 * 1954 * 16 * 576 + 2 * 2044 * 576 + 4 * 2044 + 4 * 29 * 2 + 2 * 1954 * 16 * 512 + 4 * 1954 * 16,
}

NUM_PAGES = 989669
QO_INDPTR = (0, 20, 31, 114, 128, 164, 173, 190, 327, 423, 456, 460, 499, 520, 602, 603, 613, 1033, 1061, 1081,
             1142, 1532, 1581, 1757, 1823, 1832, 1864, 1943, 1954)
KV_INDPTR = (0, 23, 38, 123, 141, 180, 191, 212, 353, 452, 488, 494, 538, 561, 651, 655, 669, 1092, 1122, 1145,
             1209, 1602, 1655, 1835, 1905, 1917, 1951, 2032, 2044)
SM_SCALE = 0.1352337747812271


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        qo, kv, heads, pool = QO_INDPTR, KV_INDPTR, 16, NUM_PAGES
    else:
        qo, kv, heads, pool = (0, 3, 4, 9), (0, 5, 6, 13), 4, 40
    bf16 = torch.bfloat16
    q_nope = torch.randn(qo[-1], heads, 512, device=device, dtype=bf16)
    q_pe = torch.randn(qo[-1], heads, 64, device=device, dtype=bf16)
    ckv_cache = torch.randn(pool, 1, 512, device=device, dtype=bf16)
    kpe_cache = torch.randn(pool, 1, 64, device=device, dtype=bf16)
    qo_indptr = torch.tensor(qo, device=device, dtype=torch.int32)
    kv_indptr = torch.tensor(kv, device=device, dtype=torch.int32)
    kv_indices = torch.randperm(pool, device=device)[:kv[-1]].to(torch.int32)
    return [q_nope, q_pe, ckv_cache, kpe_cache, qo_indptr, kv_indptr, kv_indices, SM_SCALE]


def reference(q_nope, q_pe, ckv_cache, kpe_cache, qo_indptr, kv_indptr, kv_indices, sm_scale):
    compute = torch.promote_types(q_nope.dtype, torch.float32)
    total_q, heads, rank = q_nope.shape
    out = torch.empty(total_q, heads, rank, dtype=q_nope.dtype, device=q_nope.device)
    lse = torch.empty(total_q, heads, dtype=compute, device=q_nope.device)
    qo, kv = qo_indptr.tolist(), kv_indptr.tolist()
    for b in range(len(qo) - 1):
        pages = kv_indices[kv[b]:kv[b + 1]].long()
        ckv, kpe = ckv_cache[pages, 0].to(compute), kpe_cache[pages, 0].to(compute)
        q_len, kv_len = qo[b + 1] - qo[b], kv[b + 1] - kv[b]
        hidden_from = torch.arange(kv_len, device=q_nope.device)
        for i in range(q_len):
            t = qo[b] + i
            logits = (q_nope[t].to(compute) @ ckv.T + q_pe[t].to(compute) @ kpe.T) * sm_scale
            logits = logits.masked_fill(hidden_from > kv_len - q_len + i, float("-inf"))
            lse[t] = torch.logsumexp(logits, dim=-1) / math.log(2.0)
            out[t] = (torch.softmax(logits, dim=-1) @ ckv).to(q_nope.dtype)
    return out, lse
