"""Multi-scale retention (RetNet parallel form) without normalisation: per-head decay gamma_h = 1 - 2^(-5-h), D[n, m] = gamma_h^(n-m) for n >= m (else 0), o = ((q k^T / sqrt(256)) * D) v; q/k [B,8,T,256], v [B,8,T,512] bf16 in, bf16 o [B,8,T,512] out."""
# Source: RetNet (Sun et al., 2023, "Retentive Network"), 1.3B configuration: 8 heads, key dim 256
# and value dim 512 per head, multi-scale decay gamma_h = 1 - 2^(-5 - h).
# Original (MetaKernelBench p70, after flash-linear-attention's naive retention): plain retention on
# q, k, v (no GroupNorm, no output gate, no decay-mask normalisation); head-first inputs.
# Semantics: D[h, n, m] = 2^((n - m) log2(gamma_h)) for n >= m, else 0; scores = (q / sqrt(256)) k^T
# * D; o = scores v; computed in fp32 (fp64 in the anchor), rounded to bf16 once.
# Workload: 8 sequences x 8 heads x 1024 tokens. Fixed: shapes, decays.
# Redrawn per draw: q, k, v (N(0,1), bf16).
import torch

DTYPE = "bf16"
SOL = {
    "flops": 2 * 8 * 8 * (1024 * 1025 // 2) * (256 + 512) + 2 * 8 * 8 * (1024 * 1025 // 2),
    "bytes": 2 * (2 * 8 * 8 * 1024 * 256 + 8 * 8 * 1024 * 512) + 2 * 8 * 8 * 1024 * 512,
}


def make_inputs(device="cuda", scale="full"):
    batch, heads, seq, dk, dv = (8, 8, 1024, 256, 512) if scale == "full" else (2, 3, 24, 16, 32)
    bf = torch.bfloat16
    q = torch.randn(batch, heads, seq, dk, device=device, dtype=bf)
    k = torch.randn(batch, heads, seq, dk, device=device, dtype=bf)
    v = torch.randn(batch, heads, seq, dv, device=device, dtype=bf)
    return [q, k, v]


def reference(q, k, v):
    cdt = torch.promote_types(q.dtype, torch.float32)
    _, h, t, dk = q.shape
    heads = torch.arange(h, dtype=cdt, device=q.device)
    log2_gamma = torch.log2(1 - torch.exp2(-5.0 - heads))
    pos = torch.arange(t, dtype=cdt, device=q.device)
    dist = pos[:, None] - pos[None, :]
    decay = torch.exp2(dist * log2_gamma[:, None, None]).masked_fill(dist < 0, 0.0)  # [h, t, t]
    scores = ((q.to(cdt) * dk ** -0.5) @ k.to(cdt).transpose(-1, -2)) * decay
    return (scores @ v.to(cdt)).to(q.dtype)
