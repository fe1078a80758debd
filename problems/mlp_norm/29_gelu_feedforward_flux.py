"""Transformer feed-forward y = Linear2(GELU_tanh(Linear1(x))) with biases, 3072 -> 12288 -> 3072 (fp32 in, fp32 out)."""
# Source: FLUX.1 (black-forest-labs) MMDiT blocks: hidden size 3072 (24 heads x 128), feed-forward
# mult 4 (inner 12288), activation "gelu-approximate" (tanh form of GELU), both Linears with bias.
# Workload: batch 32 x 512 tokens = 16,384 tokens, fp32 throughout (the judge runs the reference
# with TF32 off).
# Original (MetaKernelBench p29): the same operation, shapes and input order.
# Fixed: shapes. Redrawn per draw: x (N(0,1)), weights (N(0,1)/sqrt(fan_in)), biases (N(0,1), as
# the original draws them).
import torch
import torch.nn.functional as F

DTYPE = "fp32"
SOL = {"flops": 2 * 2 * 16384 * 3072 * 12288 + 8 * 16384 * 12288,
       "bytes": 4 * (16384 * 3072 + 12288 * 3072 + 12288 + 3072 * 12288 + 3072 + 16384 * 3072)}


def make_inputs(device="cuda", scale="full"):
    if scale == "smoke":
        b, s, d, f = 2, 16, 64, 256
    else:
        b, s, d, f = 32, 512, 3072, 12288
    x = torch.randn(b, s, d, device=device)
    w1 = torch.randn(f, d, device=device) / d ** 0.5
    b1 = torch.randn(f, device=device)
    w2 = torch.randn(d, f, device=device) / f ** 0.5
    b2 = torch.randn(d, device=device)
    return [x, w1, b1, w2, b2]


def reference(x, w1, b1, w2, b2):
    h = F.gelu(F.linear(x, w1, b1), approximate="tanh")
    return F.linear(h, w2, b2)
