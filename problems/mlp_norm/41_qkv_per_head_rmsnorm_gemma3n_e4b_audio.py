"""Q/K/V projections (1024 -> 1024 each, no bias) split into 8 heads x 128, per-head RMSNorm (eps given) of q and k with learned scales, v left as projected; return (q, k, v) as [B, S, 8, 128] (fp32)."""
# Source: Gemma 3n (google/gemma-3n-E4B) normalises attention inputs per head: RMSNorm over the
# head dim of q and k with learned weights (plain `x * weight`). Dims: width 1024 = 8 heads x 128,
# batch 64 x 128 frames.
# Original (MetaKernelBench p41): inputs (x, W_q, W_k, W_v, q_norm_weight, k_norm_weight, eps),
# three separate projections; q and k are normalised, v is not; outputs token-major
# [B, S, heads, head_dim].
# Fixed: shapes, eps 1e-6. Redrawn per draw: x (N(0,1)), W_q, W_k, W_v (N(0,1)/sqrt(1024)), q/k
# norm weights (1 + 0.1 N).
import torch
import torch.nn.functional as F

DTYPE = "fp32"
SOL = {"flops": 3 * 2 * 8192 * 1024 * 1024 + 2 * 4 * 8192 * 1024,
       "bytes": 4 * (8192 * 1024 + 3 * 1024 * 1024 + 2 * 128 + 3 * 8192 * 1024)}

EPS = 1e-6


def make_inputs(device="cuda", scale="full"):
    b, s, h, d = (2, 8, 2, 16) if scale == "smoke" else (64, 128, 8, 128)
    x = torch.randn(b, s, h * d, device=device)
    w_q = torch.randn(h * d, h * d, device=device) / (h * d) ** 0.5
    w_k = torch.randn(h * d, h * d, device=device) / (h * d) ** 0.5
    w_v = torch.randn(h * d, h * d, device=device) / (h * d) ** 0.5
    q_norm_w = 1 + 0.1 * torch.randn(d, device=device)
    k_norm_w = 1 + 0.1 * torch.randn(d, device=device)
    return [x, w_q, w_k, w_v, q_norm_w, k_norm_w, EPS]


def reference(x, w_q, w_k, w_v, q_norm_w, k_norm_w, eps):
    b, s, _ = x.shape
    d = q_norm_w.shape[0]

    def heads(w):
        return F.linear(x, w).view(b, s, -1, d)

    def rms(t, w):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps) * w

    return rms(heads(w_q), q_norm_w), rms(heads(w_k), k_norm_w), heads(w_v)
