"""FP8 block-scaled attention output projection: out = dequant(x) @ dequant(weight).T + bias, x e4m3 with 1x128 scales, weight e4m3 with 128x128 scales; bf16 out [16384, 5120]."""
# Source: Qwen3-VL-32B text config: hidden_size 5120, num_attention_heads 64, head_dim 128, so the
# attention output projection (o_proj) maps 64 * 128 = 8192 -> 5120. Qwen3-VL FP8 checkpoints use
# fine-grained FP8 e4m3: weight scales per 128x128 block, activations quantized per token per 128
# channels (1x128). dequant(v)[i, j] = v[i, j] * scale[block of (i, j)].
# Fix to the slot: the slot gave 7680 -> 7680, which is no Qwen3-VL projection; the Qwen3-VL-32B
# o_proj (8192 -> 5120) is used instead. The slot's bias epilogue is kept (a bf16 bias vector added
# after the scaled product; Qwen3's o_proj itself is bias-free).
# Semantics: products and sums in fp32 (the reference dequantizes and multiplies in fp32), bias
# added in fp32, rounded to bf16 once.
# Layout: x fp8 [16384, 8192], x_scale fp32 [16384, 64]; weight fp8 [5120, 8192] (nn.Linear
# layout), weight_scale fp32 [40, 64]; bias bf16 [5120].
# Workload: 16,384 tokens (a long prefill batch). Fixed: shapes.
# Redrawn per draw: fp8 values ~ 96 N(0, 1) clamped to +-448; scales (0.5..1.5) / 96 for x and
# (0.5..1.5) / (96 sqrt(8192)) for the weight; bias ~ 0.1 N(0, 1).
import torch

DTYPE = "fp8"
SOL = {
    "flops": 2 * 16384 * 8192 * 5120,
    "bytes": 16384 * 8192 + 4 * 16384 * 64 + 5120 * 8192 + 4 * 40 * 64 + 2 * 5120 + 2 * 16384 * 5120,
}

BLOCK = 128


def _fp8(shape, device):
    return (96.0 * torch.randn(shape, device=device)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)


def make_inputs(device="cuda", scale="full"):
    tokens, k, n = (16384, 8192, 5120) if scale == "full" else (40, 256, 384)
    x = _fp8((tokens, k), device)
    x_scale = (0.5 + torch.rand(tokens, k // BLOCK, device=device)) / 96.0
    weight = _fp8((n, k), device)
    weight_scale = (0.5 + torch.rand(n // BLOCK, k // BLOCK, device=device)) / (96.0 * k ** 0.5)
    bias = (0.1 * torch.randn(n, device=device)).to(torch.bfloat16)
    return [x, x_scale, weight, weight_scale, bias]


def reference(x, x_scale, weight, weight_scale, bias):
    compute = torch.promote_types(x_scale.dtype, torch.float32)
    tokens, k = x.shape
    n = weight.shape[0]
    xd = (x.to(compute).view(tokens, k // BLOCK, BLOCK) * x_scale.to(compute)[:, :, None]).view(tokens, k)
    wd = (weight.to(compute).view(n // BLOCK, BLOCK, k // BLOCK, BLOCK)
          * weight_scale.to(compute)[:, None, :, None]).view(n, k)
    return torch.addmm(bias.to(compute), xd, wd.T).to(bias.dtype)
