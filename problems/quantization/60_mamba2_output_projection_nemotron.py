"""NVFP4 x NVFP4 GEMM of the Mamba2 output projection with both operands pre-quantized (packed e2m1 uint8, low nibble first, e4m3 scale per 16 elements along K, fp32 per-tensor global scale): out = dequant(A) @ dequant(W)^T, bf16 [1,8192,2688]."""
# Source: NVIDIA-Nemotron-3-Nano-30B-A3B config.json: hidden_size 2688, mamba_num_heads 64,
# mamba_head_dim 64, so the Mamba2 mixer's out_proj maps d_inner = 64 * 64 = 4096 -> 2688
# (no bias); its input is the gated-RMSNorm output, quantized to NVFP4 by the preceding fused
# kernel. NVIDIA publishes an NVFP4 checkpoint of this model.
# NVFP4 (NVIDIA's 4-bit format): e2m1 codes {0, .5, 1, 1.5, 2, 3, 4, 6} with a sign bit, two per
# byte (low nibble = even element), one float8_e4m3fn scale per 16 consecutive elements along K,
# and one fp32 per-tensor global scale: value = e2m1 * block_scale * global_scale.
# Workload: one 8,192-token prefill sequence, 4096 -> 2688. Slot change: the slot lists
# 1920 -> 1920, which matches no Nemotron Mamba2 layer; we use Nemotron-3-Nano's 4096 -> 2688.
# Semantics: dequantize both operands exactly, accumulate in fp32, round to bf16 once.
# Fixed: shapes. Redrawn per draw: A (normalised activations, N(0,1)) and W (N(0, 1/4096)), both
# quantized here.
import torch

DTYPE = "nvfp4"
SOL = {
    "flops": 2 * 8192 * 4096 * 2688,
    "bytes": 8192 * 2048 + 8192 * 256 + 4 + 2688 * 2048 + 2688 * 256 + 4 + 2 * 8192 * 2688,
}

_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _e2m1_table(dtype, device):
    mag = torch.tensor(_E2M1, dtype=dtype, device=device)
    return torch.cat([mag, -mag])  # code = sign << 3 | magnitude index


def _dequant_nvfp4(packed, scale, global_scale, cdt):
    """packed [..., K/2] uint8 (low nibble first), scale [..., K/16] e4m3 -> [..., K] in cdt."""
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2).long()
    vals = _e2m1_table(cdt, packed.device)[codes].unflatten(-1, (-1, 16))
    block = scale.to(cdt) * global_scale.to(cdt)
    return (vals * block[..., None]).flatten(-2)


def _quant_tensor(x):
    """NVFP4 round-to-nearest-even quantization of x [..., K] with a per-tensor global scale."""
    global_scale = x.abs().amax() / (6.0 * 448.0)
    xb = x.unflatten(-1, (-1, 16))
    scale = (xb.abs().amax(-1) / (6.0 * global_scale)).clamp(max=448.0).to(torch.float8_e4m3fn)
    denom = scale.to(x.dtype) * global_scale
    y = xb / torch.where(denom == 0, torch.ones_like(denom), denom)[..., None]
    a = y.abs()
    ties_down = torch.tensor([0.25, 1.25, 2.5, 5.0], dtype=a.dtype, device=a.device)
    ties_up = torch.tensor([0.75, 1.75, 3.5], dtype=a.dtype, device=a.device)
    idx = torch.bucketize(a, ties_down) + torch.bucketize(a, ties_up, right=True)
    codes = (idx + 8 * (y < 0)).to(torch.uint8).flatten(-2)
    return codes[..., 0::2] | (codes[..., 1::2] << 4), scale, global_scale


def make_inputs(device="cuda", scale="full"):
    tokens, k, n = (8192, 4096, 2688) if scale == "full" else (64, 256, 96)
    a = torch.randn(1, tokens, k, device=device)
    w = torch.randn(n, k, device=device) / k ** 0.5
    a_p, a_s, a_g = _quant_tensor(a)
    w_p, w_s, w_g = _quant_tensor(w)
    return [a_p, a_s, a_g, w_p, w_s, w_g]


def reference(a_p, a_s, a_g, w_p, w_s, w_g):
    cdt = torch.promote_types(a_g.dtype, torch.float32)
    out_dtype = torch.bfloat16 if a_g.dtype != torch.float64 else torch.float64
    a = _dequant_nvfp4(a_p, a_s, a_g, cdt)
    w = _dequant_nvfp4(w_p, w_s, w_g, cdt)
    return (a @ w.T).to(out_dtype)
