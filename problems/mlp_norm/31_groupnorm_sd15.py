"""GroupNorm with 32 groups and per-channel affine over NCHW activations, eps 1e-5 (fp32 in, fp32 out)."""
# Source: Stable Diffusion 1.5 UNet (UNet2DConditionModel config): block_out_channels
# (320, 640, 1280, 1280), norm_num_groups 32, norm_eps 1e-5. At a 64 x 64 latent (512 px) the
# UNet runs at 64, 32, 16 and 8 px; 1280 channels appear at 16 x 16 (third down block, first up
# block) and 8 x 8 (innermost).
# Workload: batch 32 x 1280 x 16 x 16 (e.g. 16 prompts with classifier-free guidance, doubled):
# 40 channels a group, 10,240 values per (image, group). The slot's 32 x 1280 x 8 x 8 ran in
# 0.045 ms eager on an H200, under the 0.05 ms floor, so the 16 x 16 resolution is used.
# Fixed: shapes, groups, eps. Redrawn per draw: x (N(0,1) scaled by 2 plus a per-channel offset
# N(0,1), as real activations are not zero-mean), weight (1 + 0.1 N), bias (0.1 N).
import torch
import torch.nn.functional as F

DTYPE = "fp32"
SOL = {"flops": 8 * 32 * 1280 * 256,
       "bytes": 4 * (2 * 32 * 1280 * 256 + 2 * 1280)}


def make_inputs(device="cuda", scale="full"):
    if scale == "smoke":
        b, c, hw = 2, 64, 4
    else:
        b, c, hw = 32, 1280, 16
    x = 2 * torch.randn(b, c, hw, hw, device=device) + torch.randn(1, c, 1, 1, device=device)
    weight = 1 + 0.1 * torch.randn(c, device=device)
    bias = 0.1 * torch.randn(c, device=device)
    return [x, weight, bias]


def reference(x, weight, bias):
    return F.group_norm(x, 32, weight, bias, eps=1e-5)
