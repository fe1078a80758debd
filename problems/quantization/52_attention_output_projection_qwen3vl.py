"""FP8 block-scaled attention output projection with quantization inside: x (bf16) quantized to e4m3 per token per 128 channels, W (bf16) quantized per 128x128 block, out = dequant(x) @ dequant(W.T) + bias, bf16 [16384, 7680]."""
# Source: Qwen3-VL (fine-grained FP8 checkpoints: e4m3 weights with one scale per 128x128 block,
# activations quantized dynamically per token per 128 channels).
# Original (MetaKernelBench p52): inputs (attn_output [16384, 7680], o_proj_weight [7680, 7680],
# o_proj_bias [7680]), both quantized inside the reference; 16384 x 7680 -> 16384 x 7680.
# Semantics: blockwise e4m3 quantization with scale = amax(block) / 448 and
# q = e4m3(v / scale) (round to nearest even, saturating at 448): x in 1 x 128 blocks, the
# transposed weight W.T [7680 in, 7680 out] in 128 x 128 blocks; the dequantized operands are
# multiplied in fp32 (fp64 in the anchor), the bias added in fp32, the result rounded to bf16.
# Workload: 32 sequences x 512 tokens = 16,384 tokens.
# Fixed: shapes. Redrawn per draw: x (N(0,1)), W (N(0,1)/sqrt(7680) times a per-128x128-block gain
# U(0.5, 2)), bias (N(0,1)), all bf16.
import torch

DTYPE = "fp8"
SOL = {
    "flops": 2 * 16384 * 7680 * 7680,
    "bytes": 2 * 16384 * 7680 + 2 * 7680 * 7680 + 2 * 7680 + 2 * 16384 * 7680,
}

BLOCK = 128
E4M3_MAX = 448.0


def _quantize(t, rows, cols):
    """Blockwise e4m3 quantization of t [R, C] in rows x cols blocks: (codes, fp scales [R/rows, C/cols])."""
    r, c = t.shape
    blocks = t.view(r // rows, rows, c // cols, cols)
    scale = blocks.abs().amax(dim=(1, 3), keepdim=True).clamp(min=1e-12) / E4M3_MAX
    codes = (blocks / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return codes, scale


def _dequantized(t, rows, cols):
    codes, scale = _quantize(t, rows, cols)
    return (codes.to(t.dtype) * scale).view(t.shape)


def make_inputs(device="cuda", scale="full"):
    tokens, k, n = (16384, 7680, 7680) if scale == "full" else (40, 256, 384)
    bf = torch.bfloat16
    x = torch.randn(tokens, k, device=device, dtype=bf)
    gain = torch.rand(n // BLOCK, k // BLOCK, device=device) * 1.5 + 0.5
    weight = torch.randn(n, k, device=device) / k ** 0.5
    weight = (weight * gain.repeat_interleave(BLOCK, dim=0).repeat_interleave(BLOCK, dim=1)).to(bf)
    bias = torch.randn(n, device=device, dtype=bf)
    return [x, weight, bias]


def reference(x, weight, bias):
    compute = torch.promote_types(x.dtype, torch.float32)
    xd = _dequantized(x.to(compute), 1, BLOCK)
    wd = _dequantized(weight.to(compute).T.contiguous(), BLOCK, BLOCK)
    return (xd @ wd + bias.to(compute)).to(x.dtype)
