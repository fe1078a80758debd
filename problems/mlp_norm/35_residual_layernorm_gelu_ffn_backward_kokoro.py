"""Backward of the post-LN feed-forward block out = LayerNorm(x + W2 GELU(W1 x + b1) + b2): given x, parameters and dL/dout, return (dx, dW1, db1, dW2, db2, d_ln_weight, d_ln_bias) (fp32)."""
# Source: Kokoro-82M (StyleTTS 2-based TTS) config: hidden_dim 512; its ALBERT-style text encoder
# (PL-BERT) has intermediate_size 2048 and post-LN blocks. Dims as in the slot: hidden 512,
# intermediate 2048. Block here: residual add, then LayerNorm (eps 1e-5, affine), exact erf
# GELU, Linears with bias.
# Workload: batch 64 x 1,087 tokens = 69,568 tokens (odd length on purpose: no power-of-two
# tiling of the token dimension), hidden 512, intermediate 2048. The FFN forward is recomputed
# from x inside the backward (activation checkpointing).
# Fixed: shapes, eps. Redrawn per draw: x, grad_out (N(0,1)), W (N(0,1)/sqrt(fan_in)), biases
# (0.02 N), LN weight (1 + 0.1 N) and bias (0.1 N).
import math

import torch
import torch.nn.functional as F

DTYPE = "fp32"
SOL = {"flops": 6 * 2 * 69568 * 512 * 2048 + 30 * 69568 * 2048 + 30 * 69568 * 512,
       "bytes": 4 * (2 * 69568 * 512 + 2 * 512 * 2048 + 2048 + 3 * 512 + 69568 * 512 + 2 * 512 * 2048 + 2048 + 3 * 512)}


def make_inputs(device="cuda", scale="full"):
    if scale == "smoke":
        b, s, d, f = 2, 7, 32, 128
    else:
        b, s, d, f = 64, 1087, 512, 2048
    x = torch.randn(b, s, d, device=device)
    w1 = torch.randn(f, d, device=device) / d ** 0.5
    b1 = 0.02 * torch.randn(f, device=device)
    w2 = torch.randn(d, f, device=device) / f ** 0.5
    b2 = 0.02 * torch.randn(d, device=device)
    ln_w = 1 + 0.1 * torch.randn(d, device=device)
    ln_b = 0.1 * torch.randn(d, device=device)
    grad_out = torch.randn(b, s, d, device=device)
    return [x, w1, b1, w2, b2, ln_w, ln_b, grad_out]


def reference(x, w1, b1, w2, b2, ln_w, ln_b, grad_out):
    d = x.shape[-1]
    x2 = x.reshape(-1, d)
    dy = grad_out.reshape(-1, d)
    # forward recomputation
    z1 = F.linear(x2, w1, b1)
    a = F.gelu(z1)
    r = x2 + F.linear(a, w2, b2)
    mu = r.mean(-1, keepdim=True)
    rc = r - mu
    rstd = torch.rsqrt(rc.pow(2).mean(-1, keepdim=True) + 1e-5)
    rhat = rc * rstd
    # LayerNorm backward
    d_ln_w = (dy * rhat).sum(0)
    d_ln_b = dy.sum(0)
    g = dy * ln_w
    dr = rstd * (g - g.mean(-1, keepdim=True) - rhat * (g * rhat).mean(-1, keepdim=True))
    # FFN backward
    db2 = dr.sum(0)
    dw2 = dr.t() @ a
    da = dr @ w2
    dgelu = 0.5 * (1 + torch.erf(z1 * (1 / math.sqrt(2)))) + z1 * torch.exp(-0.5 * z1 * z1) * (1 / math.sqrt(2 * math.pi))
    dz1 = da * dgelu
    db1 = dz1.sum(0)
    dw1 = dz1.t() @ x2
    dx = dr + dz1 @ w1
    return dx.reshape(x.shape), dw1, db1, dw2, db2, d_ln_w, d_ln_b
