"""MLA ragged causal prefill, non-absorbed (bf16): per sequence, q [.,16,192] attends k [.,16,192] / v [.,16,128] of the same sequence (kv_len = prefix + q_len, query i sees kv j <= i + kv_len - q_len), logits scaled by sm_scale; return out [q tokens, 16, 128] (bf16) and the base-2 LSE (fp32)."""
# Source: DeepSeek-V3 at tensor parallel 8 (16 heads per GPU): in prefill MLA runs non-absorbed, the
# latent cache expanded to per-head keys (nope 128 + rope 64 = 192) and values (128), i.e. ordinary
# multi-head attention with head dims 192 / 128. Shape of the original MetaKernelBench p16, a
# captured FlashInfer-Bench workload: 63 sequences with the query lengths Q_LENS fixed below (38..54;
# 2,885 tokens) and a 256-token cached prefix each (19,013 KV tokens), sm_scale the captured
# 0.08838834764831843 = 1/sqrt(128) (not DeepSeek's YaRN-scaled 1/sqrt(192)), kept as the original
# has it and passed as a Python float.
# Layout (ragged, sequences back to back): q [2885, 16, 192]; k [19013, 16, 192], v [19013, 16, 128];
# qo_indptr, kv_indptr int32 [64] (each sequence's keys are its prefix, then its q_len new tokens).
# lse[t, h] = log2(sum over visible j of exp(sm_scale * q_t.k_j)). The reference handles each
# sequence whole, like the original's.
# Fixed: shapes, the lengths, sm_scale. Redrawn per draw: q, k, v ~ N(0, 1).
import math

import torch

DTYPE = "bf16"
SOL = {
    "flops": 2 * 16 * (192 + 128) * 806655,
    "bytes": 2 * 2885 * 16 * 192 + 2 * 19013 * 16 * (192 + 128) + 4 * 64 * 2 + 2 * 2885 * 16 * 128 + 4 * 2885 * 16,
}

Q_LENS = (39, 38, 39, 39, 39, 40, 40, 40, 41, 40, 40, 42, 42, 41, 42, 42, 43, 42, 43, 42, 43, 43, 44, 44, 44, 46, 45,
          44, 45, 45, 46, 46, 46, 46, 46, 47, 47, 47, 47, 48, 49, 48, 47, 48, 49, 50, 49, 49, 50, 50, 51, 51, 50, 51,
          51, 52, 50, 52, 53, 53, 54, 53, 52)
PREFIX_LEN = 256
SM_SCALE = 0.08838834764831843


def _indptr(lengths, device):
    return torch.tensor((0, *lengths), device=device).cumsum(0).to(torch.int32)


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        q_lens, prefix, heads = Q_LENS, PREFIX_LEN, 16
    else:
        q_lens, prefix, heads = (5, 1, 9), 4, 4
    kv_lens = [n + prefix for n in q_lens]
    bf16 = torch.bfloat16
    q = torch.randn(sum(q_lens), heads, 192, device=device, dtype=bf16)
    k = torch.randn(sum(kv_lens), heads, 192, device=device, dtype=bf16)
    v = torch.randn(sum(kv_lens), heads, 128, device=device, dtype=bf16)
    return [q, k, v, _indptr(q_lens, device), _indptr(kv_lens, device), SM_SCALE]


def reference(q, k, v, qo_indptr, kv_indptr, sm_scale):
    compute = torch.promote_types(q.dtype, torch.float32)
    total_q, heads, _ = q.shape
    out = torch.empty(total_q, heads, v.shape[2], dtype=q.dtype, device=q.device)
    lse = torch.empty(total_q, heads, dtype=compute, device=q.device)
    qo, kv = qo_indptr.tolist(), kv_indptr.tolist()
    for b in range(len(qo) - 1):
        qs = q[qo[b]:qo[b + 1]].to(compute)
        ks, vs = k[kv[b]:kv[b + 1]].to(compute), v[kv[b]:kv[b + 1]].to(compute)
        n, m = qs.shape[0], ks.shape[0]
        logits = torch.einsum("qhd,khd->qhk", qs, ks) * sm_scale
        visible = torch.arange(m, device=q.device)[None, :] <= torch.arange(n, device=q.device)[:, None] + (m - n)
        logits = logits.masked_fill(~visible[:, None, :], float("-inf"))
        lse[qo[b]:qo[b + 1]] = torch.logsumexp(logits, dim=-1) / math.log(2.0)
        out[qo[b]:qo[b + 1]] = torch.einsum("qhk,khd->qhd", torch.softmax(logits, dim=-1), vs).to(q.dtype)
    return out, lse
