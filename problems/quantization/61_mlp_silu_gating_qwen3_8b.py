"""NVFP4 SwiGLU MLP with mid-chain requantization: x (bf16) quantized to NVFP4 inside, gate and up GEMMs with pre-quantized NVFP4 weights (each with its global decode scale, a Python float) rounded to bf16, h = silu(gate) * up in bf16, h requantized to NVFP4, down GEMM; returns bf16 [B,S,4096]."""
# Source: Qwen3-8B config.json: hidden_size 4096, intermediate_size 12288, hidden_act silu.
# NVFP4 (NVIDIA's 4-bit format): e2m1 codes {0, .5, 1, 1.5, 2, 3, 4, 6} with a sign bit, two per
# byte (low nibble = even element), one e4m3 scale per 16 consecutive elements along K, one fp32
# global decode scale per tensor: value = e2m1 * block_scale * global_decode. Quantizing t: global
# encode g = 448 * 6 / amax(t); block_scale = e4m3(amax16 / 6 * g) (at most 448);
# code = e2m1(t * g / block_scale), round half to even, saturating at 6; global decode = 1 / g.
# Original (MetaKernelBench p61): inputs x [32, 512, 4096], then for W_gate [12288, 4096], W_up
# [12288, 4096] and W_down [4096, 12288] each: codes, block scales and the global decode scale as a
# Python float (10 inputs); the reference turns each float into an fp32 tensor. The weights are drawn
# N(0,1) times a literal the recipe does not show and quantized by the same quantizer as the
# activations (global decode = amax / (448 * 6)); we take 0.02, as its sibling p59 draws its weight.
# The scale only sets the output's magnitude: the global scale puts the block scales in e4m3's range.
# Semantics: each GEMM quantizes its activation with its own global scale and multiplies the
# dequantized operands in fp32 (fp64 in the anchor); gate and up are rounded to bf16, h = silu(gate)
# * up is taken in bf16, then quantized for the down GEMM, whose result is rounded to bf16.
# Workload: 32 sequences x 512 tokens = 16,384 tokens.
# Fixed: shapes. Redrawn per draw: x (N(0,1), bf16); weights 0.02 N(0,1) (quantized here).
import torch
import torch.nn.functional as F

DTYPE = "nvfp4"
SOL = {
    "flops": 2 * 16384 * 4096 * 24576 + 2 * 16384 * 12288 * 4096 + 6 * 16384 * 12288,
    "bytes": 2 * 16384 * 4096 + 24576 * 2048 + 24576 * 256 + 4096 * 6144 + 4096 * 768 + 2 * 16384 * 4096,
}
E2M1_MAX, E4M3_MAX = 6.0, 448.0
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _nvfp4_quantize(t, global_decode=None):
    """NVFP4 quantization of t [..., K] along K: (packed e2m1 codes uint8 [..., K/2], low nibble = even
    element; e4m3 block scales [..., K/16]; global decode scale). Without a given global decode scale it
    is amax(t) / (448 * 6). Codes round half to even and saturate at 6."""
    if global_decode is None:
        amax = t.abs().amax()
        encode = torch.where(amax > 0, E4M3_MAX * E2M1_MAX / amax, torch.ones_like(amax))
    else:
        encode = 1.0 / global_decode.to(t.dtype)
    blocks = t.unflatten(-1, (-1, 16))
    scale = (blocks.abs().amax(-1) / E2M1_MAX * encode).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    sf = scale.to(t.dtype)
    factor = torch.where(sf > 0, encode / sf, torch.zeros_like(sf))
    scaled = (blocks * factor[..., None]).clamp(-E2M1_MAX, E2M1_MAX)
    mag = scaled.abs()
    ties_down = torch.tensor((0.25, 1.25, 2.5, 5.0), dtype=t.dtype, device=t.device)
    ties_up = torch.tensor((0.75, 1.75, 3.5), dtype=t.dtype, device=t.device)
    idx = torch.bucketize(mag, ties_down) + torch.bucketize(mag, ties_up, right=True)
    codes = (idx + 8 * (scaled < 0)).to(torch.uint8).flatten(-2)
    return codes[..., 0::2] | (codes[..., 1::2] << 4), scale, 1.0 / encode


def _nvfp4_dequantize(packed, scale, global_decode, compute):
    """Values e2m1 * block scale * global decode scale, [..., K] in the compute dtype."""
    codes = torch.stack((packed & 15, packed >> 4), dim=-1).flatten(-2).long()
    magnitudes = torch.tensor(_E2M1, dtype=compute, device=packed.device)
    values = torch.cat([magnitudes, -magnitudes])[codes].unflatten(-1, (-1, 16))
    return (values * (scale.to(compute) * global_decode.to(compute))[..., None]).flatten(-2)


def make_inputs(device="cuda", scale="full"):
    batch, seq, hidden, inter = (32, 512, 4096, 12288) if scale == "full" else (2, 16, 128, 384)
    x = torch.randn(batch, seq, hidden, device=device, dtype=torch.bfloat16)
    weights = []
    for rows, cols in ((inter, hidden), (inter, hidden), (hidden, inter)):
        packed, block_scale, global_decode = _nvfp4_quantize(0.02 * torch.randn(rows, cols, device=device))
        weights += [packed, block_scale, global_decode.item()]
    return [x, *weights]


def _linear(t, packed, scale, global_decode, compute):
    a_packed, a_scale, a_global = _nvfp4_quantize(t.to(compute))
    a = _nvfp4_dequantize(a_packed, a_scale, a_global, compute)
    w_global = torch.tensor(global_decode, dtype=torch.float32, device=t.device)
    return (a @ _nvfp4_dequantize(packed, scale, w_global, compute).T).to(t.dtype)


def reference(x, gate_packed, gate_scale, gate_global, up_packed, up_scale, up_global, down_packed, down_scale,
              down_global):
    compute = torch.promote_types(x.dtype, torch.float32)
    x2 = x.reshape(-1, x.shape[-1])
    gate = _linear(x2, gate_packed, gate_scale, gate_global, compute)
    h = F.silu(gate) * _linear(x2, up_packed, up_scale, up_global, compute)
    return _linear(h, down_packed, down_scale, down_global, compute).view(x.shape)
