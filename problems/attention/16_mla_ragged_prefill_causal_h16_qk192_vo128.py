"""MLA ragged causal prefill, non-absorbed (bf16): per sequence, q [.,16,192] attends k [.,16,192] / v [.,16,128] of the same sequence (kv_len = prefix + q_len, query i sees kv j <= i + kv_len - q_len), scores scaled by sm_scale; return out [q tokens, 16, 128] (bf16) and the base-2 LSE (fp32)."""
# Source: DeepSeek-V3 config.json: num_attention_heads 128 (tensor parallel 8 -> 16 heads per GPU),
# qk_nope_head_dim 128 + qk_rope_head_dim 64 = 192-d query/key heads, v_head_dim 128,
# rope_scaling yarn (factor 40, mscale_all_dim 1). In prefill MLA runs non-absorbed: the latent
# cache is expanded to per-head keys (nope 128 + shared rope 64) and values (128), so this is
# ordinary multi-head attention with head dims 192 / 128. Softmax scale 192^-0.5 * m^2 with the YaRN
# factor m = 0.1 * ln(40) + 1 (about 0.1353).
# Layout (ragged, sequences back to back): q [q tokens, 16, 192] with qo_indptr int32 [seqs + 1];
# k [kv tokens, 16, 192], v [kv tokens, 16, 128] with kv_indptr int32 [seqs + 1]; each sequence's
# kv rows are its cached prefix followed by its q_len new tokens. lse[t, h] = log2(sum exp(score)).
# Workload: 63 sequences with query lengths 38..54 (2,898 query tokens in all) and a 256-token
# prefix each (19,026 kv tokens). Fixed: shapes, the totals, the prefix length. Redrawn per draw:
# q, k, v ~ N(0, 1) and the query lengths (a random split of 2,898 with each length in 38..54).
import math

import torch

DTYPE = "bf16"
SOL = {
    "flops": 2 * 16 * (192 + 128) * (2898 * 256 + 2898 * 47 // 2),
    "bytes": 2 * 2898 * 16 * 192 + 2 * 19026 * 16 * (192 + 128) + 4 * 64 * 2 + 2 * 2898 * 16 * 128 + 4 * 2898 * 16,
}

SM_SCALE = 192 ** -0.5 * (0.1 * math.log(40.0) + 1.0) ** 2


def _lengths(seqs, low, high, total, device):
    """Random lengths in [low, high] summing to total."""
    extra = total - seqs * low
    units = torch.randperm(seqs * (high - low), device=device)[:extra]
    return low + torch.bincount(units // (high - low), minlength=seqs)


def _indptr(lengths):
    return torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(torch.int32)


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        seqs, heads, low, high, q_total, prefix = 63, 16, 38, 54, 2898, 256
    else:
        seqs, heads, low, high, q_total, prefix = 3, 2, 2, 5, 10, 3
    q_lens = _lengths(seqs, low, high, q_total, device)
    kv_lens = q_lens + prefix
    kv_total = q_total + seqs * prefix
    q = torch.randn(q_total, heads, 192, device=device).to(torch.bfloat16)
    k = torch.randn(kv_total, heads, 192, device=device).to(torch.bfloat16)
    v = torch.randn(kv_total, heads, 128, device=device).to(torch.bfloat16)
    return [q, k, v, _indptr(q_lens), _indptr(kv_lens)]


def _padded_index(indptr, width):
    """[seqs, width] flat row index of each sequence's j-th element (0 where j >= length) and the mask."""
    start, length = indptr[:-1].long(), (indptr[1:] - indptr[:-1]).long()
    j = torch.arange(width, device=indptr.device)
    valid = j[None, :] < length[:, None]
    return torch.where(valid, start[:, None] + j[None, :], torch.zeros_like(j)[None, :]), valid


def reference(q, k, v, qo_indptr, kv_indptr):
    compute = torch.promote_types(q.dtype, torch.float32)
    q_lens, kv_lens = (qo_indptr[1:] - qo_indptr[:-1]).long(), (kv_indptr[1:] - kv_indptr[:-1]).long()
    q_idx, q_valid = _padded_index(qo_indptr, int(q_lens.max()))
    kv_idx, kv_valid = _padded_index(kv_indptr, int(kv_lens.max()))
    qp = q[q_idx].to(compute).transpose(1, 2)                           # [seqs, heads, q, 192]
    kp = k[kv_idx].to(compute).transpose(1, 2)                          # [seqs, heads, kv, 192]
    vp = v[kv_idx].to(compute).transpose(1, 2)                          # [seqs, heads, kv, 128]
    scores = (qp @ kp.transpose(-1, -2)) * SM_SCALE
    i = torch.arange(q_idx.shape[1], device=q.device)
    j = torch.arange(kv_idx.shape[1], device=q.device)
    visible = j[None, None, :] <= i[None, :, None] + (kv_lens - q_lens)[:, None, None]
    visible = visible & kv_valid[:, None, :]
    scores = scores.masked_fill(~visible[:, None], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    probs = torch.exp(scores - lse.masked_fill(~q_valid[:, None, :, None], 0.0))
    out = (probs @ vp).transpose(1, 2)[q_valid]                         # [q tokens, heads, 128]
    lse = lse.squeeze(-1).transpose(1, 2)[q_valid]
    return out.to(q.dtype), lse / math.log(2.0)
