"""Absorbed MLA paged decode (page size 1, bf16): scores = (q_nope.ckv + q_pe.kpe) / sqrt(192) over each sequence's pages kv_indices[kv_indptr[b]:kv_indptr[b+1]], out = softmax(scores) @ ckv; return out (bf16) and the base-2 LSE (fp32)."""
# Source: DeepSeek-V3 config.json: num_attention_heads 128, kv_lora_rank 512, qk_nope_head_dim 128,
# qk_rope_head_dim 64, v_head_dim 128; tensor parallel 8 gives 16 heads per GPU. In the absorbed
# ("weight-absorbed") decode form the nope query is mapped into the 512-d latent space, every head
# attends over one shared latent cache (compressed kv, 512) plus a shared rope key (64), and the
# output stays in the latent space (the up-projection to v_head_dim happens afterwards). Softmax
# scale 1/sqrt(qk_nope_head_dim + qk_rope_head_dim) = 1/sqrt(192).
# Layout: q_nope [batch, 16, 512], q_pe [batch, 16, 64]; ckv_cache [num_pages, 512] and
# kpe_cache [num_pages, 64] (page size 1: one token per page); kv_indptr int32 [batch + 1],
# kv_indices int32 [total kv tokens] (CSR page table in token order).
# lse[b, h] = log2(sum_j exp(score_j)) (base 2).
# Workload: batch 64 decode requests, 75,145 KV tokens in all (lengths a random split of the
# total, each >= 1), from a pool of 989,669 pages (1.1 GB of cache). Fixed: shapes, total KV
# tokens, pool size. Redrawn per draw: q_nope, q_pe, both caches ~ N(0, 1); the lengths and the
# page ids (distinct pages drawn at random from the pool).
import math

import torch

DTYPE = "bf16"
SOL = {
    "flops": 2 * 75145 * 16 * (512 + 64 + 512),
    "bytes": 2 * 64 * 16 * 576 + 2 * 75145 * 576 + 4 * 75145 + 4 * 65 + 2 * 64 * 16 * 512 + 4 * 64 * 16,
}

SM_SCALE = 1.0 / math.sqrt(192)


def _split(total, parts, device):
    """Random lengths >= 1 that sum to total."""
    cuts = torch.randperm(total - 1, device=device)[: parts - 1] + 1
    bounds = torch.cat([torch.zeros(1, dtype=torch.int64, device=device), cuts.sort().values,
                        torch.full((1,), total, dtype=torch.int64, device=device)])
    return bounds.diff()


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        batch, heads, total, pool = 64, 16, 75145, 989669
    else:
        batch, heads, total, pool = 3, 4, 20, 50
    q_nope = torch.randn(batch, heads, 512, device=device).to(torch.bfloat16)
    q_pe = torch.randn(batch, heads, 64, device=device).to(torch.bfloat16)
    ckv_cache = torch.randn(pool, 512, device=device).to(torch.bfloat16)
    kpe_cache = torch.randn(pool, 64, device=device).to(torch.bfloat16)
    lengths = _split(total, batch, device)
    kv_indptr = torch.cat([torch.zeros(1, dtype=torch.int64, device=device), lengths.cumsum(0)]).to(torch.int32)
    kv_indices = torch.randperm(pool, device=device)[:total].to(torch.int32)
    return [q_nope, q_pe, ckv_cache, kpe_cache, kv_indptr, kv_indices]


def reference(q_nope, q_pe, ckv_cache, kpe_cache, kv_indptr, kv_indices):
    compute = torch.promote_types(q_nope.dtype, torch.float32)
    batch, heads, rank = q_nope.shape
    tokens = kv_indices.long()
    ckv = ckv_cache[tokens].to(compute)
    kpe = kpe_cache[tokens].to(compute)
    qn, qp = q_nope.to(compute), q_pe.to(compute)
    out = torch.empty(batch, heads, rank, dtype=compute, device=q_nope.device)
    lse = torch.empty(batch, heads, dtype=compute, device=q_nope.device)
    bounds = kv_indptr.tolist()
    for b in range(batch):
        c, p = ckv[bounds[b]:bounds[b + 1]], kpe[bounds[b]:bounds[b + 1]]
        scores = (qn[b] @ c.T + qp[b] @ p.T) * SM_SCALE
        lse_b = torch.logsumexp(scores, dim=-1, keepdim=True)
        out[b] = torch.exp(scores - lse_b) @ c
        lse[b] = lse_b.squeeze(-1) / math.log(2.0)
    return out.to(q_nope.dtype), lse
