"""Absorbed MLA paged causal prefill (page size 1, bf16): for each sequence, scores = sm_scale * (q_nope.ckv + q_pe.kpe) over its pages kv_indices[kv_indptr[b]:kv_indptr[b+1]], query i sees kv j <= i + kv_len - q_len; out = softmax(scores) @ ckv; return out (bf16) and the base-2 LSE (fp32)."""
# Source: DeepSeek-V3 config.json: num_attention_heads 128 (tensor parallel 8 -> 16 heads per GPU),
# kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128, rope_scaling yarn
# (factor 40, mscale_all_dim 1). In the absorbed form the nope query is mapped into the 512-d
# latent space, every head attends over the shared latent cache (compressed kv 512) plus the shared
# rope key (64), and the output stays in the latent space. Softmax scale
# 192^-0.5 * m^2 with the YaRN factor m = 0.1 * ln(40) + 1 (about 0.1353).
# Layout: q_nope [q tokens, 16, 512], q_pe [q tokens, 16, 64] (sequences back to back,
# qo_indptr int32 [seqs + 1]); ckv_cache [num_pages, 512], kpe_cache [num_pages, 64] (page size 1:
# one token per page); kv_indptr int32 [seqs + 1], kv_indices int32 [kv tokens] (each sequence's
# pages in token order; its last q_len tokens are the new ones, the rest is cached prefix).
# lse[t, h] = log2(sum_j exp(score_j)).
# Workload: 28 sequences, 1,954 query tokens and 2,044 kv tokens (prefixes of 0.. tokens, 90 in
# all), pool of 16,384 pages. Fixed: shapes, totals, pool size. Redrawn per draw: q_nope, q_pe,
# both caches ~ N(0, 1); the query lengths (a random split, each >= 1), the prefix lengths (a
# random split of 90, zeros allowed) and the page ids (distinct, random).
import math

import torch

DTYPE = "bf16"
SOL = {
    "flops": 2 * 16 * (512 + 64 + 512) * 139000,
    "bytes": 2 * 1954 * 16 * 576 + 2 * 2044 * 576 + 4 * 2044 + 4 * 29 * 2 + 2 * 1954 * 16 * 512 + 4 * 1954 * 16,
}
# flops: 139,000 is the mean number of visible (query, kv) pairs over random splits (92k..289k).

SM_SCALE = 192 ** -0.5 * (0.1 * math.log(40.0) + 1.0) ** 2


def _split(total, parts, device, min_len=1):
    """Random lengths >= min_len that sum to total."""
    if min_len == 0:
        owner = torch.randint(0, parts, (total,), device=device)
        return torch.bincount(owner, minlength=parts)
    cuts = torch.randperm(total - 1, device=device)[: parts - 1] + 1
    bounds = torch.cat([torch.zeros(1, dtype=torch.int64, device=device), cuts.sort().values,
                        torch.full((1,), total, dtype=torch.int64, device=device)])
    return bounds.diff()


def _indptr(lengths):
    return torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(torch.int32)


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        seqs, heads, q_total, prefix_total, pool = 28, 16, 1954, 90, 16384
    else:
        seqs, heads, q_total, prefix_total, pool = 3, 2, 10, 4, 40
    q_lens = _split(q_total, seqs, device)
    kv_lens = q_lens + _split(prefix_total, seqs, device, min_len=0)
    q_nope = torch.randn(q_total, heads, 512, device=device).to(torch.bfloat16)
    q_pe = torch.randn(q_total, heads, 64, device=device).to(torch.bfloat16)
    ckv_cache = torch.randn(pool, 512, device=device).to(torch.bfloat16)
    kpe_cache = torch.randn(pool, 64, device=device).to(torch.bfloat16)
    kv_indices = torch.randperm(pool, device=device)[: q_total + prefix_total].to(torch.int32)
    return [q_nope, q_pe, ckv_cache, kpe_cache, _indptr(q_lens), _indptr(kv_lens), kv_indices]


def _padded_index(indptr, width):
    """[seqs, width] flat row index of each sequence's j-th element (0 where j >= length) and the mask."""
    start, length = indptr[:-1].long(), (indptr[1:] - indptr[:-1]).long()
    j = torch.arange(width, device=indptr.device)
    valid = j[None, :] < length[:, None]
    return torch.where(valid, start[:, None] + j[None, :], torch.zeros_like(j)[None, :]), valid


def reference(q_nope, q_pe, ckv_cache, kpe_cache, qo_indptr, kv_indptr, kv_indices):
    compute = torch.promote_types(q_nope.dtype, torch.float32)
    q_lens, kv_lens = (qo_indptr[1:] - qo_indptr[:-1]).long(), (kv_indptr[1:] - kv_indptr[:-1]).long()
    q_idx, q_valid = _padded_index(qo_indptr, int(q_lens.max()))
    kv_idx, kv_valid = _padded_index(kv_indptr, int(kv_lens.max()))
    pages = kv_indices.long()[kv_idx]                                   # [seqs, kv]
    ckv = ckv_cache[pages].to(compute)                                  # [seqs, kv, 512]
    keys = torch.cat([ckv, kpe_cache[pages].to(compute)], dim=-1)       # [seqs, kv, 576]
    q = torch.cat([q_nope, q_pe], dim=-1)[q_idx].to(compute)            # [seqs, q, heads, 576]
    scores = torch.einsum("bqhd,bkd->bhqk", q, keys) * SM_SCALE
    i = torch.arange(q_idx.shape[1], device=q.device)
    j = torch.arange(kv_idx.shape[1], device=q.device)
    visible = j[None, None, :] <= i[None, :, None] + (kv_lens - q_lens)[:, None, None]
    visible = visible & kv_valid[:, None, :]
    scores = scores.masked_fill(~visible[:, None], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)                 # -inf rows only for padding queries
    probs = torch.exp(scores - lse.masked_fill(~q_valid[:, None, :, None], 0.0))
    out = torch.einsum("bhqk,bkd->bqhd", probs, ckv)
    out, lse = out[q_valid], lse.squeeze(-1).transpose(1, 2)[q_valid]
    return out.to(q_nope.dtype), lse / math.log(2.0)
