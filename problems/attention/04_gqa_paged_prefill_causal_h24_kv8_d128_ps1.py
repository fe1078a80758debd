"""Causal GQA paged prefill attention (page size 1, bf16): ragged queries q[qo_indptr[b]:qo_indptr[b+1]] attend causally to their sequence's pages kv_indices[kv_indptr[b]:kv_indptr[b+1]]; return out (bf16) and the base-2 LSE per query and head (fp32)."""
# Source: Llama-3.2-3B config.json: hidden_size 3072, num_attention_heads 24, num_key_value_heads 8,
# head_dim 128; query head h reads kv head h // 3. Softmax scale 1/sqrt(128).
# Layout: q [total_q, 24, 128] (sequences packed back to back); k_cache, v_cache
# [num_pages, page_size=1, 8, 128]; qo_indptr, kv_indptr int32 [batch + 1]; kv_indices int32
# [total kv tokens] (one page per token, in token order). Causal mask aligned at the end of each
# sequence: query i of a sequence with q_len queries and kv_len keys sees keys j <= i + kv_len - q_len
# (here kv_len = q_len: a fresh prefill, the new tokens' K/V already written to their pages).
# lse[t, h] = log2(sum over visible j of exp(sm_scale * q_t.k_j)).
# Workload: 27 sequences, 16,372 query (= KV) tokens, lengths fixed below (16..1,741); pool of 77,646
# pages. Fixed: shapes, lengths, pool size. Redrawn per draw: q, both caches ~ N(0, 1) and the page
# ids (distinct pages drawn at random from the pool).
import math

import torch

DTYPE = "bf16"
SOL = {
    "flops": 4 * 24 * 128 * 7423778,
    "bytes": 2 * 16372 * 24 * 128 + 2 * 2 * 16372 * 8 * 128 + 4 * 16372 + 2 * 4 * 28
    + 2 * 16372 * 24 * 128 + 4 * 16372 * 24,
}

SM_SCALE = 1.0 / math.sqrt(128)
Q_LENS = [67, 766, 431, 819, 538, 60, 190, 1741, 1403, 161, 1236, 67, 341, 519, 419, 636, 1230, 565, 485,
          278, 686, 699, 625, 705, 266, 254, 1185]


def _indptr(lengths, device):
    return torch.tensor([0] + lengths, device=device).cumsum(0).to(torch.int32)


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        q_lens, heads, kv_heads, head_dim, pool = Q_LENS, 24, 8, 128, 77646
    else:
        q_lens, heads, kv_heads, head_dim, pool = [5, 1, 9], 6, 2, 128, 30
    total = sum(q_lens)
    q = torch.randn(total, heads, head_dim, device=device).to(torch.bfloat16)
    k_cache = torch.randn(pool, 1, kv_heads, head_dim, device=device).to(torch.bfloat16)
    v_cache = torch.randn(pool, 1, kv_heads, head_dim, device=device).to(torch.bfloat16)
    qo_indptr = _indptr(q_lens, device)
    kv_indptr = _indptr(q_lens, device)
    kv_indices = torch.randperm(pool, device=device)[:total].to(torch.int32)
    return [q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices]


def reference(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices):
    compute = torch.promote_types(q.dtype, torch.float32)
    total_q, heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    group = heads // kv_heads
    out = torch.empty(total_q, heads, head_dim, dtype=compute, device=q.device)
    lse = torch.empty(total_q, heads, dtype=compute, device=q.device)
    qo, kv = qo_indptr.tolist(), kv_indptr.tolist()
    for b in range(len(qo) - 1):
        q_len, kv_len = qo[b + 1] - qo[b], kv[b + 1] - kv[b]
        pages = kv_indices[kv[b]:kv[b + 1]].long()
        kb = k_cache[pages].reshape(kv_len, kv_heads, head_dim).to(compute)
        vb = v_cache[pages].reshape(kv_len, kv_heads, head_dim).to(compute)
        qb = q[qo[b]:qo[b + 1]].to(compute).view(q_len, kv_heads, group, head_dim)
        scores = torch.einsum("qhgd,khd->hgqk", qb, kb) * SM_SCALE
        rows = torch.arange(q_len, device=q.device)[:, None] + (kv_len - q_len)
        scores = scores.masked_fill(torch.arange(kv_len, device=q.device)[None, :] > rows, float("-inf"))
        lse_b = torch.logsumexp(scores, dim=-1, keepdim=True)
        ob = torch.einsum("hgqk,khd->qhgd", torch.exp(scores - lse_b), vb)
        out[qo[b]:qo[b + 1]] = ob.reshape(q_len, heads, head_dim)
        lse[qo[b]:qo[b + 1]] = lse_b.squeeze(-1).permute(2, 0, 1).reshape(q_len, heads) / math.log(2.0)
    return out.to(q.dtype), lse
