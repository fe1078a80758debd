"""Gated linear attention (GLA) recurrence from a zero state: per-key-channel log-decay gk (bf16), S_t = Diag(exp(gk_t)) S_{t-1} + k_t v_t^T, o_t = S_t^T (q_t K^-0.5), token by token; 4 heads with K 256 / V 512; returns bf16 o [B,T,4,512]."""
# Source: GLA (Yang et al., 2024, "Gated Linear Attention Transformers with Hardware-Efficient
# Training"), 1.3B configuration: 4 heads, key dim 256 and value dim 512 per head; the forget gate is
# gk = logsigmoid(W_gk x) / 16 (gate_logit_normalizer 16), one log-decay per key channel.
# Original (MetaKernelBench p69, after flash-linear-attention's naive recurrent GLA): inputs q, k
# [8, 1024, 4, 256], v [8, 1024, 4, 512], gk = logsigmoid(N(0,1)) / 16 rounded to bf16; all bf16.
# Reference: the token loop, each step vectorised over batch and heads, fp32 (fp64 in the anchor);
# o rounded to bf16 once.
# Workload: 8 sequences x 1024 tokens. Fixed: shapes.
# Redrawn per draw: q, k, v (N(0,1)), gk (as above).
import torch
import torch.nn.functional as F

DTYPE = "bf16"
SOL = {
    "flops": 8 * 4 * 1024 * 5 * 256 * 512,
    "bytes": 2 * (3 * 8 * 1024 * 4 * 256 + 8 * 1024 * 4 * 512) + 2 * 8 * 1024 * 4 * 512,
}


def make_inputs(device="cuda", scale="full"):
    batch, seq, heads, dk, dv = (8, 1024, 4, 256, 512) if scale == "full" else (2, 24, 2, 16, 32)
    bf = torch.bfloat16
    q = torch.randn(batch, seq, heads, dk, device=device, dtype=bf)
    k = torch.randn(batch, seq, heads, dk, device=device, dtype=bf)
    v = torch.randn(batch, seq, heads, dv, device=device, dtype=bf)
    gk = (F.logsigmoid(torch.randn(batch, seq, heads, dk, device=device)) / 16.0).to(bf)
    return [q, k, v, gk]


def reference(q, k, v, gk):
    cdt, out_dtype = torch.promote_types(q.dtype, torch.float32), q.dtype
    q, k, v, gk = (x.to(cdt).transpose(1, 2) for x in (q, k, v, gk))  # [B, H, T, D]
    b, h, t, dk = q.shape
    scale = dk ** -0.5
    state = q.new_zeros(b, h, dk, v.shape[-1])
    o = torch.empty_like(v)
    for i in range(t):
        state = state * gk[:, :, i, :, None].exp() + k[:, :, i, :, None] * v[:, :, i, None, :]
        o[:, :, i] = torch.einsum("bhk,bhkv->bhv", q[:, :, i] * scale, state)
    return o.transpose(1, 2).to(out_dtype)
