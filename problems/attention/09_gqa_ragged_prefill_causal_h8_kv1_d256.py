"""Causal GQA ragged prefill attention (bf16, 8 q heads sharing 1 kv head, head dim 256): queries q[qo_indptr[b]:qo_indptr[b+1]] attend causally to keys/values k, v[kv_indptr[b]:kv_indptr[b+1]] of the same sequence; return out (bf16)."""
# Source: Qwen3-Next-80B-A3B config.json, full-attention layers (every 4th layer): num_attention_heads
# 16, num_key_value_heads 2, head_dim 256; tensor parallel 2 gives 8 query heads and 1 kv head per
# GPU. Softmax scale 1/sqrt(256). The attention core only: q/k norms, partial RoPE and the output
# gate of Qwen3-Next's gated attention are applied outside this step.
# Layout (ragged, no paging): q [total_q, 8, 256]; k, v [total_kv, 1, 256]; qo_indptr, kv_indptr
# int32 [batch + 1] (equal here: a fresh prefill, kv_len = q_len); query i sees keys j <= i
# (the general rule j <= i + kv_len - q_len).
# Workload: 63 sequences, lengths 1..3,072 (20,164 tokens; roughly log-uniform), fixed below. The
# slot gave only the sequence count; the lengths are authored here.
# Fixed: shapes, lengths. Redrawn per draw: q, k, v ~ N(0, 1).
import math

import torch

DTYPE = "bf16"
SOL = {
    "flops": 4 * 8 * 256 * 15340552,
    "bytes": 2 * 20164 * 8 * 256 + 2 * 2 * 20164 * 1 * 256 + 2 * 4 * 64 + 2 * 20164 * 8 * 256,
}

SM_SCALE = 1.0 / math.sqrt(256)
Q_LENS = [1772, 17, 8, 1, 1, 26, 33, 1, 11, 550, 20, 6, 2, 3, 3, 42, 6, 20, 96, 13, 4, 1258, 6, 1233, 5, 566,
          87, 78, 2054, 13, 157, 1, 21, 2222, 1002, 14, 4, 115, 175, 1035, 30, 2, 1, 13, 6, 118, 42, 53, 2, 3,
          3072, 1183, 902, 663, 157, 12, 435, 228, 71, 256, 94, 40, 100]


def _indptr(lengths, device):
    return torch.tensor([0] + lengths, device=device).cumsum(0).to(torch.int32)


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        q_lens, heads, kv_heads, head_dim = Q_LENS, 8, 1, 256
    else:
        q_lens, heads, kv_heads, head_dim = [5, 1, 9], 4, 1, 256
    kv_lens = q_lens
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
