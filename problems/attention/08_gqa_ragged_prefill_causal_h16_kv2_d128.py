"""Causal GQA ragged prefill attention (bf16, 16 q heads / 2 kv heads): queries q[qo_indptr[b]:qo_indptr[b+1]] attend causally (aligned at the sequence end) to keys/values k, v[kv_indptr[b]:kv_indptr[b+1]], logits scaled by sm_scale; return out (bf16) and the base-2 LSE per query and head (fp32)."""
# Source: Qwen3-32B at tensor parallel 4 (64 q / 8 kv heads of 128 -> 16 q heads and 2 kv heads per
# GPU; query head h reads kv head h // 8) in the shape of the original MetaKernelBench p08, a captured
# FlashInfer-Bench workload (query lengths exact) with the original's authored cached prefixes:
# 71 sequences, Q_LENS (1..2,678; 15,687 tokens) and PREFIX_LENS (0..64; kv_len = prefix + q_len,
# 17,699 keys) fixed below, sm_scale 1/sqrt(128) passed as a Python float.
# Layout (ragged, no paging): q [15687, 16, 128]; k, v [17699, 2, 128]; qo_indptr, kv_indptr int32
# [72]. Query i sees keys j <= i + kv_len - q_len. lse[t, h] = log2(sum over visible j of
# exp(sm_scale * q_t.k_j)). The reference handles each sequence whole, like the original's.
# Fixed: shapes, the lengths, sm_scale. Redrawn per draw: q, k, v ~ N(0, 1).
import math

import torch

DTYPE = "bf16"
SOL = {
    "flops": 4 * 16 * 128 * 11642685,
    "bytes": 2 * 15687 * 16 * 128 + 2 * 2 * 17699 * 2 * 128 + 2 * 4 * 72 + 2 * 15687 * 16 * 128 + 4 * 15687 * 16,
}

Q_LENS = (133, 181, 9, 8, 14, 43, 24, 29, 2383, 2678, 314, 14, 420, 134, 4, 15, 43, 2024, 23, 1618, 1086, 300, 49,
          7, 340, 422, 1, 68, 18, 7, 74, 3, 20, 21, 12, 31, 3, 7, 21, 40, 14, 107, 11, 6, 30, 9, 26, 24, 301, 266,
          247, 75, 49, 23, 9, 4, 441, 15, 349, 27, 14, 17, 54, 6, 13, 8, 147, 8, 7, 9, 730)
PREFIX_LENS = (0, 64, 17, 39, 5, 58, 26, 44, 11, 0, 33, 61, 8, 22, 49, 0, 14, 55, 30, 3, 41, 64, 19, 7, 36, 0, 52,
               24, 60, 13, 28, 46, 1, 0, 57, 20, 35, 9, 63, 42, 16, 0, 50, 27, 4, 38, 59, 23, 12, 45, 0, 31, 54, 18,
               6, 40, 62, 29, 15, 48, 0, 34, 21, 51, 10, 56, 2, 43, 25, 37, 0)
SM_SCALE = 0.08838834764831843


def _indptr(lengths, device):
    return torch.tensor((0, *lengths), device=device).cumsum(0).to(torch.int32)


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        q_lens, prefix_lens, heads, kv_heads = Q_LENS, PREFIX_LENS, 16, 2
    else:
        q_lens, prefix_lens, heads, kv_heads = (5, 1, 9), (0, 3, 2), 8, 2
    kv_lens = [n + p for n, p in zip(q_lens, prefix_lens)]
    bf16 = torch.bfloat16
    q = torch.randn(sum(q_lens), heads, 128, device=device, dtype=bf16)
    k = torch.randn(sum(kv_lens), kv_heads, 128, device=device, dtype=bf16)
    v = torch.randn(sum(kv_lens), kv_heads, 128, device=device, dtype=bf16)
    return [q, k, v, _indptr(q_lens, device), _indptr(kv_lens, device), SM_SCALE]


def reference(q, k, v, qo_indptr, kv_indptr, sm_scale):
    compute = torch.promote_types(q.dtype, torch.float32)
    total_q, heads, head_dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    out = torch.empty(total_q, heads, head_dim, dtype=q.dtype, device=q.device)
    lse = torch.empty(total_q, heads, dtype=compute, device=q.device)
    qo, kv = qo_indptr.tolist(), kv_indptr.tolist()
    for b in range(len(qo) - 1):
        qs = q[qo[b]:qo[b + 1]].to(compute)
        ks = k[kv[b]:kv[b + 1]].to(compute).repeat_interleave(group, dim=1)
        vs = v[kv[b]:kv[b + 1]].to(compute).repeat_interleave(group, dim=1)
        n, m = qs.shape[0], ks.shape[0]
        logits = torch.einsum("qhd,khd->qhk", qs, ks) * sm_scale
        visible = torch.arange(m, device=q.device)[None, :] <= torch.arange(n, device=q.device)[:, None] + (m - n)
        logits = logits.masked_fill(~visible[:, None, :], float("-inf"))
        lse[qo[b]:qo[b + 1]] = torch.logsumexp(logits, dim=-1) / math.log(2.0)
        out[qo[b]:qo[b + 1]] = torch.einsum("qhk,khd->qhd", torch.softmax(logits, dim=-1), vs).to(q.dtype)
    return out, lse
