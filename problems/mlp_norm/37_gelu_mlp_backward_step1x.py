"""Backward of the MLP y = W2 GELU_tanh(W1 x + b1) + b2: given x, weights and dL/dy, return (dx, dW1, db1, dW2, db2) (fp32)."""
# Source: Step1X-Edit (StepFun image-editing DiT, FLUX-family MMDiT design). Dims as in the slot:
# width 2048, MLP ratio 4 (intermediate 8192), tanh-approximated GELU as in FLUX-family DiT
# MLPs, Linears with bias.
# Workload: batch 64 x 128 tokens = 8,192 tokens. The first Linear and GELU are recomputed from x
# inside the backward (activation checkpointing); fp32 throughout (TF32 off in the judge).
# Fixed: shapes. Redrawn per draw: x, grad_y (N(0,1)), W (N(0,1)/sqrt(fan_in)), biases (0.02 N).
import math

import torch
import torch.nn.functional as F

DTYPE = "fp32"
SOL = {"flops": 5 * 2 * 8192 * 2048 * 8192 + 20 * 8192 * 8192,
       "bytes": 4 * (2 * 8192 * 2048 + 2 * 2048 * 8192 + 8192 + 2048 + 8192 * 2048 + 2 * 2048 * 8192 + 8192 + 2048)}


def make_inputs(device="cuda", scale="full"):
    if scale == "smoke":
        b, s, d, f = 2, 8, 32, 128
    else:
        b, s, d, f = 64, 128, 2048, 8192
    x = torch.randn(b, s, d, device=device)
    w1 = torch.randn(f, d, device=device) / d ** 0.5
    b1 = 0.02 * torch.randn(f, device=device)
    w2 = torch.randn(d, f, device=device) / f ** 0.5
    b2 = 0.02 * torch.randn(d, device=device)
    grad_y = torch.randn(b, s, d, device=device)
    return [x, w1, b1, w2, b2, grad_y]


def reference(x, w1, b1, w2, b2, grad_y):
    d = x.shape[-1]
    x2 = x.reshape(-1, d)
    dy = grad_y.reshape(-1, d)
    z = F.linear(x2, w1, b1)
    k = math.sqrt(2 / math.pi)
    t = torch.tanh(k * (z + 0.044715 * z ** 3))
    a = 0.5 * z * (1 + t)
    dgelu = 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * k * (1 + 3 * 0.044715 * z * z)
    db2 = dy.sum(0)
    dw2 = dy.t() @ a
    dz = (dy @ w2) * dgelu
    db1 = dz.sum(0)
    dw1 = dz.t() @ x2
    dx = dz @ w1
    return dx.reshape(x.shape), dw1, db1, dw2, db2
