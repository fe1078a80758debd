"""Backward of residual RMSNorm y = weight * x_hat from saved x_hat and rstd: given dL/dy (bf16), x_hat (bf16), rstd (bf16 [B,S,1]) and weight, return (dL/dx, dL/dresidual, dL/dweight) where the hidden-state and residual gradients are the same tensor (bf16 out)."""
# Source: Qwen3-4B config.json: hidden_size 2560, rms_norm_eps 1e-6. In a pre-norm decoder the
# norm input is r = x + residual, so dL/dx and dL/dresidual are both dL/dr.
# Original (MetaKernelBench p38): inputs (grad_output, normalized, rstd, weight), 3 outputs, the
# first two the same gradient; workload 64 x 8,192 x 2560.
# Semantics (fp32, fp64 in the anchor): dweight = sum over batch and tokens of dy * x_hat;
# g = dy * weight; dr = rstd * (g - x_hat * mean(g * x_hat)) (mean over the hidden dim); dr is
# rounded to bf16 and returned twice; dweight is returned in the weight dtype.
# Workload: 64 sequences x 8,192 tokens x 2560 (1.34 G elements; the eager reference's fp32
# temporaries peak near 30 GB).
# Fixed: shapes, eps 1e-6 (used to build rstd). Redrawn per draw: x = N(0,1) * U(0.5, 2) per token
# (bf16); rstd = 1 / sqrt(mean(x^2) + 1e-6) taken in bf16, as the original takes it from the bf16 x
# (a bf16 [B, S, 1] input); x_hat = x * rstd (bf16); weight = 1 + 0.1 N (bf16);
# dy = N(0,1) + 0.5 x_hat * weight (bf16), as the original draws them.
import torch

DTYPE = "bf16"
SOL = {"flops": 8 * 524288 * 2560,
       "bytes": 2 * 524288 * 2560 * 4 + 2 * 524288 + 2 * 2 * 2560}


def make_inputs(device="cuda", scale="full"):
    if scale == "smoke":
        b, s, d = 2, 8, 64
    else:
        b, s, d = 64, 8192, 2560
    bf = torch.bfloat16
    x = torch.randn(b, s, d, device=device, dtype=bf)
    x = x * (torch.rand(b, s, 1, device=device, dtype=bf) * 1.5 + 0.5)
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    normalized = (x * rstd).to(bf)
    weight = torch.randn(d, device=device, dtype=bf) * 0.1 + 1.0
    grad_y = (torch.randn(b, s, d, device=device, dtype=bf) + 0.5 * normalized * weight).to(bf)
    return [grad_y, normalized, rstd, weight]


def reference(grad_y, normalized, rstd, weight):
    ct = torch.promote_types(grad_y.dtype, torch.float32)
    dy = grad_y.to(ct, copy=True)
    grad_w = (dy * normalized).sum(dim=(0, 1))
    g = dy.mul_(weight.to(ct))
    dot = (g * normalized).mean(-1, keepdim=True)
    dr = g.sub_(normalized * dot).mul_(rstd.to(ct)).to(grad_y.dtype)
    return dr, dr, grad_w.to(weight.dtype)
