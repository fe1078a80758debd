"""Backward of the post-LN feed-forward block out = LayerNorm(x + W2 GELU_tanh(W1 x)) * ln_weight + ln_bias from saved forward values (W1 x, GELU output, normalised output, variance): given dL/dout, return (dx, dW1, db1, dW2, db2, d_ln_weight, d_ln_bias) (fp32)."""
# Source: Kokoro-82M (StyleTTS 2-based TTS) config: hidden_dim 512; its ALBERT-style text encoder
# (PL-BERT) has intermediate_size 2048 and post-LN blocks.
# Original (MetaKernelBench p35): inputs (grad_output, hidden_states, W1, fc1_output, gelu_output,
# W2, normalized, var, ln_weight, eps) with the forward values saved rather than recomputed, tanh
# GELU, 7 outputs (gradients of x, W1, b1, W2, b2, LayerNorm weight and bias; the biases are zero
# in the saved forward, their gradients are still returned).
# Semantics: rstd = 1 / sqrt(var + eps); g = dy * ln_weight;
# dr = rstd * (g - mean(g) - n * mean(g * n)) (n the saved normalised output, means over the
# hidden dim); db2 = sum dr; dW2 = dr^T gelu; da = dr W2; dz = da * GELU_tanh'(z) with z the saved
# fc1 output; db1 = sum dz; dW1 = dz^T x; dx = dr + dz W1; d_ln_weight = sum dy * n; d_ln_bias =
# sum dy (sums over batch and tokens). fp32 throughout (TF32 off in the judge).
# Workload: batch 64 x 1,087 tokens = 69,568 tokens, hidden 512, intermediate 2048.
# Fixed: shapes, eps 1e-5. Redrawn per draw: x, dy (N(0,1)), W1, W2 (N(0,1)/sqrt(fan_in)),
# ln_weight (1 + 0.1 N); the saved values are the exact fp32 forward of these.
import math

import torch

DTYPE = "fp32"
SOL = {"flops": 4 * 2 * 69568 * 512 * 2048 + 30 * 69568 * 2048 + 30 * 69568 * 512,
       "bytes": 4 * (4 * 69568 * 512 + 2 * 69568 * 2048 + 2 * 512 * 2048 + 69568 + 512
                     + 69568 * 512 + 2 * 512 * 2048 + 2048 + 3 * 512)}

EPS = 1e-5
_C = math.sqrt(2 / math.pi)


def make_inputs(device="cuda", scale="full"):
    if scale == "smoke":
        b, s, d, f = 2, 7, 32, 128
    else:
        b, s, d, f = 64, 1087, 512, 2048
    x = torch.randn(b, s, d, device=device)
    w1 = torch.randn(f, d, device=device) / d ** 0.5
    w2 = torch.randn(d, f, device=device) / f ** 0.5
    ln_w = 1 + 0.1 * torch.randn(d, device=device)
    z = x @ w1.t()
    a = 0.5 * z * (1 + torch.tanh(_C * (z + 0.044715 * z ** 3)))
    r = x + a @ w2.t()
    mean = r.mean(-1, keepdim=True)
    var = (r - mean).pow(2).mean(-1, keepdim=True)
    normalized = (r - mean) / torch.sqrt(var + EPS)
    grad_out = torch.randn(b, s, d, device=device)
    return [grad_out, x, w1, z, a, w2, normalized, var, ln_w, EPS]


def reference(grad_out, x, w1, fc1_out, gelu_out, w2, normalized, var, ln_w, eps):
    d, f = x.shape[-1], fc1_out.shape[-1]
    dy, n = grad_out.reshape(-1, d), normalized.reshape(-1, d)
    d_ln_w = (dy * n).sum(0)
    d_ln_b = dy.sum(0)
    g = dy * ln_w
    rstd = torch.rsqrt(var.reshape(-1, 1) + eps)
    dr = rstd * (g - g.mean(-1, keepdim=True) - n * (g * n).mean(-1, keepdim=True))
    db2 = dr.sum(0)
    dw2 = dr.t() @ gelu_out.reshape(-1, f)
    z = fc1_out.reshape(-1, f)
    t = torch.tanh(_C * (z + 0.044715 * z ** 3))
    dz = (dr @ w2) * (0.5 * (1 + t) + 0.5 * z * (1 - t * t) * _C * (1 + 3 * 0.044715 * z * z))
    db1 = dz.sum(0)
    dw1 = dz.t() @ x.reshape(-1, d)
    dx = dr + dz @ w1
    return dx.view(x.shape), dw1, db1, dw2, db2, d_ln_w, d_ln_b
