"""ConvNeXt V2 block tail on NHWC activations: out = shortcut + Linear2(GRN(GELU(Linear1(LayerNorm(x))))) with Global Response Normalization over H x W (fp32 in, fp32 out)."""
# Source: ConvNeXt V2 (Woo et al., 2023), ConvNeXt V2-Base stage 1: 128 channels at 56 x 56 for a
# 224 px input, inverted bottleneck 4x (hidden 512), LayerNorm eps 1e-6, exact GELU, and GRN:
# G = ||X||_2 over (H, W) per (image, channel); N = G / (mean of G over channels + 1e-6);
# GRN(X) = gamma * (X * N) + beta + X. The block is residual around the depthwise conv + MLP; here
# x is the depthwise-conv output and shortcut the block input (stochastic depth off).
# Workload: batch 64, 56 x 56, 128 channels (200,704 pixels), hidden 512, channels-last.
# Fixed: shapes, eps. Redrawn per draw: x, shortcut (N(0,1)), LN weight (1 + 0.1 N) and bias
# (0.1 N), Linear weights (N(0,1)/sqrt(fan_in)), biases (0.02 N), GRN gamma and beta (0.1 N; the
# paper initialises them to zero, which would make GRN the identity).
import torch
import torch.nn.functional as F

DTYPE = "fp32"
SOL = {"flops": 2 * 2 * 200704 * 128 * 512 + 10 * 200704 * 512 + 10 * 200704 * 128,
       "bytes": 4 * (3 * 200704 * 128 + 2 * 128 + 512 * 128 + 512 + 2 * 512 + 128 * 512 + 128)}


def make_inputs(device="cuda", scale="full"):
    if scale == "smoke":
        b, hw, c = 2, 7, 16
    else:
        b, hw, c = 64, 56, 128
    f = 4 * c
    x = torch.randn(b, hw, hw, c, device=device)
    shortcut = torch.randn(b, hw, hw, c, device=device)
    ln_w = 1 + 0.1 * torch.randn(c, device=device)
    ln_b = 0.1 * torch.randn(c, device=device)
    w1 = torch.randn(f, c, device=device) / c ** 0.5
    b1 = 0.02 * torch.randn(f, device=device)
    gamma = 0.1 * torch.randn(f, device=device)
    beta = 0.1 * torch.randn(f, device=device)
    w2 = torch.randn(c, f, device=device) / f ** 0.5
    b2 = 0.02 * torch.randn(c, device=device)
    return [x, shortcut, ln_w, ln_b, w1, b1, gamma, beta, w2, b2]


def reference(x, shortcut, ln_w, ln_b, w1, b1, gamma, beta, w2, b2):
    h = F.layer_norm(x, (x.shape[-1],), ln_w, ln_b, eps=1e-6)
    h = F.gelu(F.linear(h, w1, b1))
    g = torch.linalg.vector_norm(h, ord=2, dim=(1, 2), keepdim=True)
    n = g / (g.mean(dim=-1, keepdim=True) + 1e-6)
    h = gamma * (h * n) + beta + h
    return shortcut + F.linear(h, w2, b2)
