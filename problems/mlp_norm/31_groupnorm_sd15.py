"""GroupNorm with 32 groups and per-channel affine over NCHW activations, eps given (fp32 in, fp32 out)."""
# Source: Stable Diffusion 1.5 UNet (UNet2DConditionModel config): block_out_channels
# (320, 640, 1280, 1280), norm_num_groups 32, norm_eps 1e-5. At a 64 x 64 latent (512 px) the
# innermost blocks run 1280 channels at 8 x 8.
# Original (MetaKernelBench p31): batch 32 x 1280 x 8 x 8, inputs (x, weight, bias, eps).
# Semantics: per (image, group of 40 channels) mean and biased variance over 40 x 8 x 8 = 2,560
# values, x_hat = (x - mean) / sqrt(var + eps), out = x_hat * weight[c] + bias[c], computed
# step by step in fp32 (fp64 in the anchor).
# Workload: 32 x 1280 x 8 x 8, the original's. (An earlier version of this problem used 16 x 16
# because a single fused GroupNorm call ran in 0.045 ms eager, under the 0.05 ms floor; the
# step-by-step reference is the original's form.)
# Fixed: shapes, groups, eps 1e-5. Redrawn per draw: x (N(0,1)), weight (1 + 0.1 N), bias (0.1 N).
import torch

DTYPE = "fp32"
SOL = {"flops": 8 * 32 * 1280 * 64,
       "bytes": 4 * (2 * 32 * 1280 * 64 + 2 * 1280)}

GROUPS = 32
EPS = 1e-5


def make_inputs(device="cuda", scale="full"):
    if scale == "smoke":
        b, c, hw = 2, 64, 4
    else:
        b, c, hw = 32, 1280, 8
    x = torch.randn(b, c, hw, hw, device=device)
    weight = 1 + 0.1 * torch.randn(c, device=device)
    bias = 0.1 * torch.randn(c, device=device)
    return [x, weight, bias, EPS]


def reference(x, weight, bias, eps):
    compute = torch.promote_types(x.dtype, torch.float32)
    b, c = x.shape[:2]
    g = x.to(compute).reshape(b, GROUPS, -1)
    mean = g.mean(dim=-1, keepdim=True)
    var = (g - mean).pow(2).mean(dim=-1, keepdim=True)
    x_hat = ((g - mean) * torch.rsqrt(var + eps)).reshape(x.shape)
    out = x_hat * weight.to(compute).view(1, c, 1, 1) + bias.to(compute).view(1, c, 1, 1)
    return out.to(x.dtype)
