"""Multi-scale retention (RetNet parallel form): per-head decay gamma_h = 1 - 2^(-5-h), row-normalised decay mask, |.|-sum-normalised scores, retention output, per-head GroupNorm, swish output gate; q/k [B,T,8,256], v [B,T,8,512], gate [B,T,4096] bf16 in, bf16 [B,T,4096] out."""
# Source: RetNet (Sun et al., 2023, "Retentive Network"), 1.3B configuration: hidden 2048,
# 8 heads, key dim 2048 / 8 = 256 per head and value dim 2 * 2048 / 8 = 512 per head; multi-scale
# decay gamma_h = 1 - 2^(-5 - h); the output is GroupNorm over heads, gated by swish(X W_G).
# Parallel form with RetNet's normalisations (defined here as): D[n, m] = gamma^(n - m) for
# n >= m, else 0, every row divided by sqrt(its sum); R = (q k^T / sqrt(256)) * D; R divided per
# row by max(sum_m |R[n, m]|, 1); Y = R v; each head's 512 outputs group-normalised (mean and
# variance, no affine, eps 1e-6); out = swish(gate) * Y, heads concatenated. q and k arrive
# already rotated (xPos), v and the gate pre-activation already projected.
# Workload: 8 sequences x 1024 tokens. Computed in fp32, rounded to bf16 once.
# Fixed: shapes, decays. Redrawn per draw: q, k, v, gate (N(0,1), bf16).
import math

import torch

DTYPE = "bf16"
SOL = {
    "flops": 2 * 8 * 8 * (1024 * 1025 // 2) * (256 + 512) + 6 * 8 * 8 * (1024 * 1025 // 2)
    + 10 * 8 * 1024 * 4096,
    "bytes": 2 * (2 * 8 * 1024 * 8 * 256 + 8 * 1024 * 8 * 512 + 8 * 1024 * 4096)
    + 2 * 8 * 1024 * 4096,
}

EPS = 1e-6


def make_inputs(device="cuda", scale="full"):
    batch, seq, heads, dk, dv = (8, 1024, 8, 256, 512) if scale == "full" else (2, 24, 3, 16, 32)
    q = torch.randn(batch, seq, heads, dk, device=device).to(torch.bfloat16)
    k = torch.randn(batch, seq, heads, dk, device=device).to(torch.bfloat16)
    v = torch.randn(batch, seq, heads, dv, device=device).to(torch.bfloat16)
    gate = torch.randn(batch, seq, heads * dv, device=device).to(torch.bfloat16)
    return [q, k, v, gate]


def reference(q, k, v, gate):
    cdt = torch.promote_types(q.dtype, torch.float32)
    b, t, h, dk = q.shape
    log_gamma = torch.tensor([math.log1p(-2.0 ** (-5 - i)) for i in range(h)], dtype=cdt, device=q.device)
    pos = torch.arange(t, device=q.device)
    dist = (pos[:, None] - pos[None, :]).to(cdt)
    decay = (dist * log_gamma[:, None, None]).masked_fill(dist < 0, float("-inf")).exp()  # [h, t, t]
    decay = decay / decay.sum(-1, keepdim=True).sqrt()
    qh, kh, vh = (x.to(cdt).transpose(1, 2) for x in (q, k, v))
    r = (qh @ kh.transpose(-1, -2)) * dk ** -0.5 * decay
    r = r / r.abs().sum(-1, keepdim=True).clamp(min=1)
    y = r @ vh  # [b, h, t, dv]
    y = (y - y.mean(-1, keepdim=True)) * torch.rsqrt(y.var(-1, unbiased=False, keepdim=True) + EPS)
    y = y.transpose(1, 2).reshape(b, t, -1)
    g = gate.to(cdt)
    return (g * torch.sigmoid(g) * y).to(gate.dtype)
