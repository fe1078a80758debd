"""Causal GQA ragged prefill attention (bf16, 16 q heads / 2 kv heads): queries q[qo_indptr[b]:qo_indptr[b+1]] attend causally (aligned at the sequence end) to keys/values k, v[kv_indptr[b]:kv_indptr[b+1]]; return out (bf16)."""
# Source: Qwen3-32B config.json: num_attention_heads 64, num_key_value_heads 8, head_dim 128; tensor
# parallel 4 gives 16 query heads and 2 kv heads per GPU; query head h reads kv head h // 8.
# Softmax scale 1/sqrt(128).
# Layout (ragged, no paging): q [total_q, 16, 128]; k, v [total_kv, 2, 128]; qo_indptr, kv_indptr
# int32 [batch + 1]. Each sequence's keys are a cached prefix followed by its q_len new tokens
# (kv_len = prefix + q_len); query i sees keys j <= i + kv_len - q_len.
# Workload: 71 sequences, query lengths 1..2,678 (29,914 tokens; roughly log-uniform) with authored
# prefixes of 0..64 tokens (2,279 in all, 32,193 keys), lengths fixed below.
# Fixed: shapes, lengths. Redrawn per draw: q, k, v ~ N(0, 1).
import math

import torch

DTYPE = "bf16"
SOL = {
    "flops": 4 * 16 * 128 * 21943026,
    "bytes": 2 * 29914 * 16 * 128 + 2 * 2 * 32193 * 2 * 128 + 2 * 4 * 72 + 2 * 29914 * 16 * 128,
}

SM_SCALE = 1.0 / math.sqrt(128)
Q_LENS = [257, 992, 5, 4, 8, 1, 24, 6, 3, 460, 339, 211, 6, 72, 9, 6, 11, 498, 1020, 8, 7, 5, 628, 2, 327, 15,
          2575, 2174, 36, 50, 220, 807, 96, 37, 55, 54, 13, 577, 813, 1885, 2678, 117, 320, 1, 36, 620, 14, 45,
          890, 230, 1739, 4, 464, 269, 706, 14, 689, 1, 468, 2410, 824, 1121, 33, 1, 246, 670, 18, 952, 2, 14, 2]
PREFIX_LENS = [12, 41, 56, 59, 42, 16, 43, 9, 22, 55, 23, 39, 0, 13, 36, 30, 48, 16, 61, 19, 18, 14, 22, 59, 3,
               0, 15, 61, 29, 48, 6, 60, 29, 48, 51, 5, 44, 13, 35, 38, 15, 37, 21, 43, 37, 0, 23, 60, 21, 11,
               45, 60, 34, 8, 43, 23, 14, 63, 46, 0, 64, 22, 59, 18, 61, 52, 21, 36, 29, 28, 47]


def _indptr(lengths, device):
    return torch.tensor([0] + lengths, device=device).cumsum(0).to(torch.int32)


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        q_lens, prefix_lens, heads, kv_heads, head_dim = Q_LENS, PREFIX_LENS, 16, 2, 128
    else:
        q_lens, prefix_lens, heads, kv_heads, head_dim = [5, 1, 9], [0, 3, 2], 4, 2, 128
    kv_lens = [n + p for n, p in zip(q_lens, prefix_lens)]
    q = torch.randn(sum(q_lens), heads, head_dim, device=device).to(torch.bfloat16)
    k = torch.randn(sum(kv_lens), kv_heads, head_dim, device=device).to(torch.bfloat16)
    v = torch.randn(sum(kv_lens), kv_heads, head_dim, device=device).to(torch.bfloat16)
    return [q, k, v, _indptr(q_lens, device), _indptr(kv_lens, device)]


def reference(q, k, v, qo_indptr, kv_indptr):
    compute = torch.promote_types(q.dtype, torch.float32)
    total_q, heads, head_dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    out = torch.empty(total_q, heads, head_dim, dtype=compute, device=q.device)
    qo, kv = qo_indptr.tolist(), kv_indptr.tolist()
    for b in range(len(qo) - 1):
        q_len, kv_len = qo[b + 1] - qo[b], kv[b + 1] - kv[b]
        qb = q[qo[b]:qo[b + 1]].to(compute).view(q_len, kv_heads, group, head_dim)
        kb, vb = k[kv[b]:kv[b + 1]].to(compute), v[kv[b]:kv[b + 1]].to(compute)
        scores = torch.einsum("qhgd,khd->hgqk", qb, kb) * SM_SCALE
        rows = torch.arange(q_len, device=q.device)[:, None] + (kv_len - q_len)
        scores = scores.masked_fill(torch.arange(kv_len, device=q.device)[None, :] > rows, float("-inf"))
        ob = torch.einsum("hgqk,khd->qhgd", torch.softmax(scores, dim=-1), vb)
        out[qo[b]:qo[b + 1]] = ob.reshape(q_len, heads, head_dim)
    return out.to(q.dtype)
