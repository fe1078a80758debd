"""FP8 block-scaled MLP gate-up projection with SiLU gating: h = dequant(x) @ dequant(w_gate_up).T, out = silu(h[:, :12288]) * h[:, 12288:]; x e4m3 1x128 scales, weight e4m3 128x128 scales; bf16 out [8704, 12288]."""
# Source: Qwen3-VL-8B text config: hidden_size 4096, intermediate_size 12288, hidden_act silu
# (SwiGLU MLP: gate_proj and up_proj 4096 -> 12288, fused here into one [24576, 4096] weight, gate
# rows first). Qwen3-VL FP8 checkpoints use fine-grained FP8 e4m3: weight scales per 128x128 block,
# activations quantized per token per 128 channels (1x128). dequant(v)[i, j] = v[i, j] * scale[block].
# Fix to the slot: the slot gave 3584 -> 18,944, the Qwen2-VL/Qwen2.5-VL-7B MLP; the Qwen3-VL-8B MLP
# (4096 -> 2 x 12288) is used so the shapes match the named model.
# Semantics: products and sums in fp32, SiLU gating in fp32, rounded to bf16 once.
# Layout: x fp8 [8704, 4096], x_scale fp32 [8704, 32]; w_gate_up fp8 [24576, 4096], w_scale fp32
# [192, 32].
# Workload: 8,704 tokens (a prefill batch with image tokens). Fixed: shapes.
# Redrawn per draw: fp8 values ~ 96 N(0, 1) clamped to +-448; scales (0.5..1.5) / 96 for x and
# (0.5..1.5) / (96 sqrt(4096)) for the weight.
import torch

DTYPE = "fp8"
SOL = {
    "flops": 2 * 8704 * 4096 * 24576 + 4 * 8704 * 12288,
    "bytes": 8704 * 4096 + 4 * 8704 * 32 + 24576 * 4096 + 4 * 192 * 32 + 2 * 8704 * 12288,
}

BLOCK = 128


def _fp8(shape, device):
    return (96.0 * torch.randn(shape, device=device)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)


def make_inputs(device="cuda", scale="full"):
    tokens, k, inter = (8704, 4096, 12288) if scale == "full" else (40, 256, 256)
    x = _fp8((tokens, k), device)
    x_scale = (0.5 + torch.rand(tokens, k // BLOCK, device=device)) / 96.0
    w_gate_up = _fp8((2 * inter, k), device)
    w_scale = (0.5 + torch.rand(2 * inter // BLOCK, k // BLOCK, device=device)) / (96.0 * k ** 0.5)
    return [x, x_scale, w_gate_up, w_scale]


def reference(x, x_scale, w_gate_up, w_scale):
    compute = torch.promote_types(x_scale.dtype, torch.float32)
    out_dtype = torch.bfloat16 if x_scale.dtype != torch.float64 else torch.float64
    tokens, k = x.shape
    n = w_gate_up.shape[0]
    xd = (x.to(compute).view(tokens, k // BLOCK, BLOCK) * x_scale.to(compute)[:, :, None]).view(tokens, k)
    wd = (w_gate_up.to(compute).view(n // BLOCK, BLOCK, k // BLOCK, BLOCK)
          * w_scale.to(compute)[:, None, :, None]).view(n, k)
    gate, up = (xd @ wd.T).chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(out_dtype)
