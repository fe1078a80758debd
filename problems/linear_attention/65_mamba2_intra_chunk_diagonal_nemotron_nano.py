"""Mamba2 SSD intra-chunk (diagonal block) output: y[l] = sum_{s<=l} (C_l . B_s) exp(sum_{s<j<=l} a_j) x_s within each 128-token chunk, 64 heads of 128 in 8 B/C groups, state 128; x [B,1,128,64,128], a [B,64,1,128], B/C [B,1,128,8,128] bf16 in, bf16 y [B,1,128,64,128] out."""
# Source: NVIDIA Nemotron Nano Mamba2 layers (chunked SSD, n_groups 8, chunk 128). In the chunked
# SSD algorithm the diagonal blocks are the within-chunk quadratic ("attention-like") part: a
# masked, decay-weighted C B^T applied to x (already dt-scaled).
# Original (MetaKernelBench p65): inputs (x [B, chunks, chunk, heads, 128], per-step log-decays
# [B, heads, chunks, chunk] ~ U(-0.02, 0) (named a_cumsum there, and segment-summed as per-step
# values), B and C [B, chunks, chunk, groups, 128]), all bf16; batch 16, one chunk, head dim 128,
# state 128. The chunk size, head and group counts are not visible in the recipe: we take
# Nemotron-3-Nano's 64 heads, 8 groups and chunk 128.
# Semantics: head h uses B/C group h // 8; L[l, s] = exp(sum_{s<j<=l} a_j) for l >= s, else 0;
# y = ((C B^T) * L) x per head; computed in fp32 (fp64 in the anchor), rounded to bf16 once.
# Workload: 16 sequences, one chunk of 128 tokens each, all 64 heads. Fixed: shapes.
# Redrawn per draw: x, B, C (N(0,1)), a (U(-0.02, 0)), all bf16.
import torch

DTYPE = "bf16"
SOL = {
    "flops": 2 * 16 * 8 * 128 * 128 * 128 + 16 * 64 * 128 * 128 * (2 * 128 + 3),
    "bytes": 2 * (16 * 128 * 64 * 128 + 16 * 64 * 128 + 2 * 16 * 128 * 8 * 128) + 2 * 16 * 128 * 64 * 128,
}


def make_inputs(device="cuda", scale="full"):
    batch, chunk, heads, p, groups, n = (16, 128, 64, 128, 8, 128) if scale == "full" else (2, 16, 8, 8, 2, 16)
    bf = torch.bfloat16
    x = torch.randn(batch, 1, chunk, heads, p, device=device, dtype=bf)
    a = torch.empty(batch, heads, 1, chunk, device=device, dtype=bf).uniform_(-0.02, 0.0)
    b = torch.randn(batch, 1, chunk, groups, n, device=device, dtype=bf)
    c = torch.randn(batch, 1, chunk, groups, n, device=device, dtype=bf)
    return [x, a, b, c]


def reference(x, a, b, c):
    cdt = torch.promote_types(x.dtype, torch.float32)
    bs, nc, l, h, p = x.shape
    g = b.shape[3]
    cs = a.to(cdt).cumsum(-1).view(bs, g, h // g, nc, l)
    keep = torch.ones(l, l, dtype=torch.bool, device=x.device).tril()
    decay = (cs[..., :, None] - cs[..., None, :]).masked_fill(~keep, float("-inf")).exp()  # [B, G, J, nc, L, L]
    cb = torch.einsum("bclgn,bcsgn->bcgls", c.to(cdt), b.to(cdt))
    xg = x.to(cdt).view(bs, nc, l, g, h // g, p)
    y = torch.einsum("bcgls,bgjcls,bcsgjp->bclgjp", cb, decay, xg)
    return y.reshape(bs, nc, l, h, p).to(x.dtype)
