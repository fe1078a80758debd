"""Causal GQA ragged prefill attention (bf16, 8 q heads sharing 1 kv head, head dim 256): queries q[qo_indptr[b]:qo_indptr[b+1]] attend causally (aligned at the sequence end) to keys/values k, v[kv_indptr[b]:kv_indptr[b+1]], logits scaled by sm_scale; return out (bf16) and the base-2 LSE per query and head (fp32)."""
# Source: Qwen3-Next-80B-A3B full-attention layers at tensor parallel 2 (16 q / 2 kv heads of 256 ->
# 8 q heads and 1 kv head per GPU; the attention core only: q/k norms, partial RoPE and the output
# gate come outside it) in the shape of the original MetaKernelBench p09, a captured FlashInfer-Bench
# workload (query lengths exact) with the original's authored cached prefixes: 63 sequences, Q_LENS
# (13..102; 3,053 tokens) and PREFIX_LENS (0..64; kv_len = prefix + q_len, 4,841 keys) fixed below.
# sm_scale is the captured 0.08838834764831843 = 1/sqrt(128), not 1/sqrt(256), kept as the original
# has it; it is passed as a Python float.
# Layout (ragged, no paging): q [3053, 8, 256]; k, v [4841, 1, 256]; qo_indptr, kv_indptr int32
# [64]. Query i sees keys j <= i + kv_len - q_len. lse[t, h] = log2(sum over visible j of
# exp(sm_scale * q_t.k_j)). The reference handles each sequence whole, like the original's.
# Fixed: shapes, the lengths, sm_scale. Redrawn per draw: q, k, v ~ N(0, 1).
import math

import torch

DTYPE = "bf16"
SOL = {
    "flops": 4 * 8 * 256 * 173223,
    "bytes": 2 * 3053 * 8 * 256 + 2 * 2 * 4841 * 1 * 256 + 2 * 4 * 64 + 2 * 3053 * 8 * 256 + 4 * 3053 * 8,
}

Q_LENS = (35, 71, 76, 69, 62, 52, 61, 39, 102, 94, 64, 44, 63, 37, 49, 56, 53, 58, 47, 18, 61, 83, 49, 63, 64, 19,
          82, 63, 17, 39, 59, 46, 66, 86, 41, 58, 36, 41, 33, 18, 19, 25, 32, 39, 68, 47, 73, 41, 50, 13, 27, 59,
          22, 29, 66, 23, 20, 37, 32, 40, 19, 55, 43)
PREFIX_LENS = (0, 64, 17, 39, 5, 58, 26, 44, 11, 0, 33, 61, 8, 22, 49, 0, 14, 55, 30, 3, 41, 64, 19, 7, 36, 0, 52,
               24, 60, 13, 28, 46, 1, 0, 57, 20, 35, 9, 63, 42, 16, 0, 50, 27, 4, 38, 59, 23, 12, 45, 0, 31, 54, 18,
               6, 40, 62, 29, 15, 48, 0, 34, 21)
SM_SCALE = 0.08838834764831843


def _indptr(lengths, device):
    return torch.tensor((0, *lengths), device=device).cumsum(0).to(torch.int32)


def make_inputs(device="cuda", scale="full"):
    q_lens, prefix_lens = (Q_LENS, PREFIX_LENS) if scale == "full" else ((5, 1, 9), (0, 3, 2))
    kv_lens = [n + p for n, p in zip(q_lens, prefix_lens)]
    bf16 = torch.bfloat16
    q = torch.randn(sum(q_lens), 8, 256, device=device, dtype=bf16)
    k = torch.randn(sum(kv_lens), 1, 256, device=device, dtype=bf16)
    v = torch.randn(sum(kv_lens), 1, 256, device=device, dtype=bf16)
    return [q, k, v, _indptr(q_lens, device), _indptr(kv_lens, device), SM_SCALE]


def reference(q, k, v, qo_indptr, kv_indptr, sm_scale):
    compute = torch.promote_types(q.dtype, torch.float32)
    total_q, heads, head_dim = q.shape
    group = heads // k.shape[1]
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
