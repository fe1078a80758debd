"""Fused QKV projection (1024 -> 3 x 1024, no bias) split into 8 heads x 128, per-head RMSNorm (eps 1e-6) of q and k with learned scales and of v without scale; return (q, k, v) as [B, heads, S, 128] (fp32)."""
# Source: Gemma 3n (google/gemma-3n-E4B) normalises attention inputs per head: RMSNorm over the
# head dim of q and k with learned weights (plain `x * weight`, not Gemma 2's 1 + weight) and of
# v without a weight, eps 1e-6. Dims as in the slot, which attributes this workload to the E4B
# audio tower: width 1024 = 8 heads x 128, batch 64 x 128 frames.
# Workload: x [64, 128, 1024] fp32, W_qkv [3072, 1024] (rows 0..1023 q, 1024..2047 k, 2048.. v);
# outputs head-major [64, 8, 128, 128] each, ready for attention.
# Fixed: shapes, eps. Redrawn per draw: x (N(0,1)), W_qkv (N(0,1)/sqrt(1024)), q/k norm weights
# (1 + 0.1 N).
import torch
import torch.nn.functional as F

DTYPE = "fp32"
SOL = {"flops": 2 * 8192 * 1024 * 3072 + 3 * 4 * 8192 * 1024,
       "bytes": 4 * (8192 * 1024 + 3072 * 1024 + 2 * 128 + 3 * 8192 * 1024)}


def make_inputs(device="cuda", scale="full"):
    if scale == "smoke":
        b, s, h, d = 2, 8, 2, 16
    else:
        b, s, h, d = 64, 128, 8, 128
    x = torch.randn(b, s, h * d, device=device)
    w_qkv = torch.randn(3 * h * d, h * d, device=device) / (h * d) ** 0.5
    q_norm_w = 1 + 0.1 * torch.randn(d, device=device)
    k_norm_w = 1 + 0.1 * torch.randn(d, device=device)
    return [x, w_qkv, q_norm_w, k_norm_w]


def _rms(t):
    return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6)


def reference(x, w_qkv, q_norm_w, k_norm_w):
    b, s, _ = x.shape
    d = q_norm_w.shape[0]
    qkv = F.linear(x, w_qkv).view(b, s, 3, -1, d)
    q = _rms(qkv[:, :, 0]) * q_norm_w
    k = _rms(qkv[:, :, 1]) * k_norm_w
    v = _rms(qkv[:, :, 2])
    return q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
