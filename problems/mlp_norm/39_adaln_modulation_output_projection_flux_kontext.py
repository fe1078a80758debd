"""DiT final layer: (scale, shift) = Linear(SiLU(temb)) split in two; out = Linear_out(LayerNorm(x, eps given) * (1 + scale) + shift), 3072 -> 64 per token (fp32 in, fp32 out)."""
# Source: FLUX.1 Kontext [dev] transformer config (FLUX.1 architecture): inner dim 3072 (24 heads
# x 128), in/out channels 64, patch size 1. Its output head is a continuous AdaLayerNorm: a
# Linear(3072 -> 6144, bias) on SiLU(temb) gives (scale, shift) in that order (first 3072 = scale),
# LayerNorm without affine, eps 1e-6, x * (1 + scale) + shift per image, then proj_out
# Linear(3072 -> 64, bias).
# Original (MetaKernelBench p39): the same operation and shapes, inputs (x, temb, W_mod, b_mod,
# W_out, b_out, eps).
# Workload: batch 32 x 256 image tokens x 3072, temb 32 x 3072, modulation 6144.
# Fixed: shapes, eps 1e-6. Redrawn per draw: x (N(0,1)), temb (N(0,1)), weights
# (N(0,1)/sqrt(fan_in)), biases (N(0,1), as the original draws them).
import torch
import torch.nn.functional as F

DTYPE = "fp32"
SOL = {"flops": 2 * 32 * 3072 * 6144 + 2 * 32 * 256 * 3072 * 64 + 10 * 32 * 256 * 3072,
       "bytes": 4 * (32 * 256 * 3072 + 32 * 3072 + 6144 * 3072 + 6144 + 64 * 3072 + 64 + 32 * 256 * 64)}

EPS = 1e-6


def make_inputs(device="cuda", scale="full"):
    if scale == "smoke":
        b, s, d, o = 2, 8, 48, 16
    else:
        b, s, d, o = 32, 256, 3072, 64
    x = torch.randn(b, s, d, device=device)
    temb = torch.randn(b, d, device=device)
    w_mod = torch.randn(2 * d, d, device=device) / d ** 0.5
    b_mod = torch.randn(2 * d, device=device)
    w_out = torch.randn(o, d, device=device) / d ** 0.5
    b_out = torch.randn(o, device=device)
    return [x, temb, w_mod, b_mod, w_out, b_out, EPS]


def reference(x, temb, w_mod, b_mod, w_out, b_out, eps):
    emb = F.linear(F.silu(temb), w_mod, b_mod)
    scale, shift = emb.chunk(2, dim=1)
    h = F.layer_norm(x, (x.shape[-1],), eps=eps)
    h = h * (1 + scale[:, None, :]) + shift[:, None, :]
    return F.linear(h, w_out, b_out)
