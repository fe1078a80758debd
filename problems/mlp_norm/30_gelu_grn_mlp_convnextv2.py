"""ConvNeXt V2 MLP with Global Response Normalization on NHWC activations: y = Linear2(GRN(GELU(Linear1(x)))), GRN over H x W with learned gamma/beta and eps given (fp32 in, fp32 out)."""
# Source: ConvNeXt V2 (Woo et al., 2023), ConvNeXt V2-Base stage 1: 128 channels at 56 x 56 for a
# 224 px input, inverted bottleneck 4x (hidden 512), exact GELU, and GRN:
# G = ||X||_2 over (H, W) per (image, channel); N = G / (mean of G over channels + eps);
# GRN(X) = gamma * (X * N) + beta + X.
# Original (MetaKernelBench p30): x -> Linear1 -> GELU -> GRN -> Linear2 with inputs
# (x, W1, b1, gamma [1,1,1,512], beta [1,1,1,512], W2, b2, eps); no LayerNorm and no residual
# inside the problem.
# Workload: batch 64, 56 x 56, 128 channels (200,704 pixels), hidden 512, channels-last.
# Fixed: shapes, eps 1e-6. Redrawn per draw: x (N(0,1)), Linear weights (N(0,1)/sqrt(fan_in)),
# biases, GRN gamma and beta (N(0,1), as the original draws them).
import torch
import torch.nn.functional as F

DTYPE = "fp32"
SOL = {"flops": 2 * 2 * 200704 * 128 * 512 + 10 * 200704 * 512,
       "bytes": 4 * (2 * 200704 * 128 + 512 * 128 + 512 + 2 * 512 + 128 * 512 + 128)}

EPS = 1e-6


def make_inputs(device="cuda", scale="full"):
    if scale == "smoke":
        b, hw, c = 2, 7, 16
    else:
        b, hw, c = 64, 56, 128
    f = 4 * c
    x = torch.randn(b, hw, hw, c, device=device)
    w1 = torch.randn(f, c, device=device) / c ** 0.5
    b1 = torch.randn(f, device=device)
    gamma = torch.randn(1, 1, 1, f, device=device)
    beta = torch.randn(1, 1, 1, f, device=device)
    w2 = torch.randn(c, f, device=device) / f ** 0.5
    b2 = torch.randn(c, device=device)
    return [x, w1, b1, gamma, beta, w2, b2, EPS]


def reference(x, w1, b1, gamma, beta, w2, b2, eps):
    h = F.gelu(F.linear(x, w1, b1))
    g = torch.linalg.vector_norm(h, ord=2, dim=(1, 2), keepdim=True)
    n = g / (g.mean(dim=-1, keepdim=True) + eps)
    return F.linear(gamma * (h * n) + beta + h, w2, b2)
