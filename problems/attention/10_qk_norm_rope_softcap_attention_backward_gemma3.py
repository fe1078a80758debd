"""Backward of a Gemma-3-style attention layer (fp32): given grad_output and the forward inputs of out = o @ o_weight.T with o = causal GQA softmax attention of soft-capped logits (cap * tanh(scaling * q.k / cap)) over q, k (per-head Gemma RMSNorm, then rotate-half RoPE with the given cos/sin) and v, return the gradients (d_hidden_states, d_q_weight, d_k_weight, d_v_weight, d_o_weight, d_q_norm_weight, d_k_norm_weight)."""
# Source: the attention core of a Gemma 3 layer (q/k RMSNorm per head applied as x * rsqrt(mean x^2
# + eps) * (1 + w), NeoX rotate-half RoPE, attention logit soft cap, no biases) in the shape of the
# original MetaKernelBench p10 (a SOL-ExecBench recipe; only part of its text is visible): batch 64 x
# 256 tokens, hidden 3072, 24 q / 8 kv heads x 128 (query head h reads kv head h // 3), eps 1e-6,
# 13 inputs in the order of the reference's signature, the scaling, cap and eps passed as Python
# floats; cos/sin [64, 256, 128] hold the same positions 0..255 for every batch row.
# Forward (recomputed; nothing is saved): q = RoPE(norm_q(x q_weight^T)), k = RoPE(norm_k(x
# k_weight^T)), v = x v_weight^T, logits = cap tanh(scaling q.k / cap), causal; o = softmax(logits) v;
# out = o o_weight^T. RoPE: q' = q cos + rotate_half(q) sin, cos/sin[p] = [cos(p f) | cos(p f)],
# f_i = theta^(-2i/128). The gradients follow from the explicit backward formulas (softmax, tanh
# cap, RoPE adjoint, RMSNorm, the four projections).
# Our reading where the recipe is hidden: scaling 0.0625 (Gemma 3's query_pre_attn_scalar 256),
# cap 50.0, RoPE base 10,000, the output order (the inputs' order).
# Fixed: shapes, the scalars, the cos/sin tables. Redrawn per draw: hidden_states, grad_output ~
# N(0, 1); q/k/v_weight ~ N(0, 1/3072), o_weight ~ N(0, 1/3072); norm weights 0.1 N(0, 1).
import math

import torch

DTYPE = "fp32"
SOL = {
    "flops": 3 * 2 * 16384 * 3072 * (3072 + 1024 + 1024) + 2 * 2 * 16384 * 3072 * 3072
    + 3 * 2 * 64 * 24 * 256 * 256 * 128,
    "bytes": 4 * (2 * 16384 * 3072 + 2 * (3072 + 1024 + 1024) * 3072 + 2 * 3072 * 3072 + 4 * 128
                  + 2 * 64 * 256 * 128 + 16384 * 3072),
}
# flops: q/k/v projections forward + 2 backward GEMMs each, the output projection 2 backward
# GEMMs (its forward is not needed); the attention core counts 6
# S x S x 256 products (2 forward, 4 backward) at half density (causal).

SCALING = 0.0625
ATTN_LOGIT_SOFTCAPPING = 50.0
RMS_NORM_EPS = 1e-6
ROPE_THETA = 10000.0


def _rope_tables(batch, seq, dim, device):
    inv_freq = 1.0 / ROPE_THETA ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim)
    angles = torch.outer(torch.arange(seq, dtype=torch.float32, device=device), inv_freq).repeat(1, 2)
    return (angles.cos().expand(batch, seq, dim).contiguous(), angles.sin().expand(batch, seq, dim).contiguous())


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        batch, seq, hidden, heads, kv_heads, dim = 64, 256, 3072, 24, 8, 128
    else:
        batch, seq, hidden, heads, kv_heads, dim = 2, 8, 48, 6, 2, 16
    grad_output = torch.randn(batch, seq, hidden, device=device)
    hidden_states = torch.randn(batch, seq, hidden, device=device)
    cos, sin = _rope_tables(batch, seq, dim, device)
    q_weight = torch.randn(heads * dim, hidden, device=device) / math.sqrt(hidden)
    k_weight = torch.randn(kv_heads * dim, hidden, device=device) / math.sqrt(hidden)
    v_weight = torch.randn(kv_heads * dim, hidden, device=device) / math.sqrt(hidden)
    o_weight = torch.randn(hidden, heads * dim, device=device) / math.sqrt(heads * dim)
    q_norm_weight = 0.1 * torch.randn(dim, device=device)
    k_norm_weight = 0.1 * torch.randn(dim, device=device)
    return [grad_output, hidden_states, cos, sin, q_weight, k_weight, v_weight, o_weight, q_norm_weight,
            k_norm_weight, SCALING, ATTN_LOGIT_SOFTCAPPING, RMS_NORM_EPS]


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def _rotate_half_adjoint(y):
    y1, y2 = y.chunk(2, dim=-1)
    return torch.cat([y2, -y1], dim=-1)


def _norm_forward(raw, weight, eps):
    r = torch.rsqrt(raw.pow(2).mean(dim=-1, keepdim=True) + eps)
    normed = raw * r
    return normed, r, normed * (1 + weight)


def _norm_backward(d_out, normed, r, weight):
    d_weight = (d_out * normed).sum(dim=(0, 1, 2))
    d_normed = d_out * (1 + weight)
    d_raw = r * (d_normed - normed * (d_normed * normed).mean(dim=-1, keepdim=True))
    return d_raw, d_weight


def reference(grad_output, hidden_states, cos, sin, q_weight, k_weight, v_weight, o_weight, q_norm_weight,
              k_norm_weight, scaling, softcap, eps):
    compute = torch.promote_types(hidden_states.dtype, torch.float32)
    x = hidden_states.to(compute)
    w_q, w_k, w_v, w_o = (w.to(compute) for w in (q_weight, k_weight, v_weight, o_weight))
    q_norm_w, k_norm_w = q_norm_weight.to(compute), k_norm_weight.to(compute)
    cos, sin = cos.to(compute)[:, :, None, :], sin.to(compute)[:, :, None, :]
    batch, seq, width = x.shape
    dim = cos.shape[-1]
    heads, kv_heads = w_q.shape[0] // dim, w_k.shape[0] // dim
    group = heads // kv_heads
    xf = x.reshape(batch * seq, width)

    # forward, keeping what the backward needs
    q_raw = (xf @ w_q.T).view(batch, seq, heads, dim)
    k_raw = (xf @ w_k.T).view(batch, seq, kv_heads, dim)
    v = (xf @ w_v.T).view(batch, seq, kv_heads, dim)
    q_normed, q_r, q_w = _norm_forward(q_raw, q_norm_w, eps)
    k_normed, k_r, k_w = _norm_forward(k_raw, k_norm_w, eps)
    q_rot = q_w * cos + _rotate_half(q_w) * sin
    k_rot = k_w * cos + _rotate_half(k_w) * sin
    q_a = q_rot.view(batch, seq, kv_heads, group, dim).permute(0, 2, 3, 1, 4)   # [b, kvh, g, s, d]
    k_a = k_rot.permute(0, 2, 1, 3)[:, :, None]                                  # [b, kvh, 1, s, d]
    v_a = v.permute(0, 2, 1, 3)[:, :, None]
    capped = torch.tanh((q_a @ k_a.transpose(-1, -2)) * (scaling / softcap))
    causal = torch.ones(seq, seq, dtype=torch.bool, device=x.device).tril()
    probs = torch.softmax((softcap * capped).masked_fill(~causal, float("-inf")), dim=-1)
    o = probs @ v_a                                                              # [b, kvh, g, s, d]
    o_flat = o.permute(0, 3, 1, 2, 4).reshape(batch * seq, heads * dim)

    # backward
    g = grad_output.to(compute).reshape(batch * seq, width)
    d_w_o = g.T @ o_flat
    d_o = (g @ w_o).view(batch, seq, kv_heads, group, dim).permute(0, 2, 3, 1, 4)
    d_probs = d_o @ v_a.transpose(-1, -2)
    d_v = (probs.transpose(-1, -2) @ d_o).sum(dim=2)                            # [b, kvh, s, d]
    d_logits = probs * (d_probs - (d_probs * probs).sum(dim=-1, keepdim=True))
    d_scores = d_logits * (1 - capped.pow(2)) * scaling
    d_q_a = d_scores @ k_a
    d_k = (d_scores.transpose(-1, -2) @ q_a).sum(dim=2)                         # [b, kvh, s, d]
    d_q_rot = d_q_a.permute(0, 3, 1, 2, 4).reshape(batch, seq, heads, dim)
    d_k_rot = d_k.permute(0, 2, 1, 3)
    d_v = d_v.permute(0, 2, 1, 3)
    d_q_w = d_q_rot * cos + _rotate_half_adjoint(d_q_rot * sin)
    d_k_w = d_k_rot * cos + _rotate_half_adjoint(d_k_rot * sin)
    d_q_raw, d_q_norm_w = _norm_backward(d_q_w, q_normed, q_r, q_norm_w)
    d_k_raw, d_k_norm_w = _norm_backward(d_k_w, k_normed, k_r, k_norm_w)
    d_q_raw = d_q_raw.reshape(batch * seq, heads * dim)
    d_k_raw = d_k_raw.reshape(batch * seq, kv_heads * dim)
    d_v = d_v.reshape(batch * seq, kv_heads * dim)
    d_x = d_q_raw @ w_q + d_k_raw @ w_k + d_v @ w_v
    d_w_q, d_w_k, d_w_v = d_q_raw.T @ xf, d_k_raw.T @ xf, d_v.T @ xf
    dt = hidden_states.dtype
    return (d_x.view(batch, seq, width).to(dt), d_w_q.to(dt), d_w_k.to(dt), d_w_v.to(dt), d_w_o.to(dt),
            d_q_norm_w.to(dt), d_k_norm_w.to(dt))
