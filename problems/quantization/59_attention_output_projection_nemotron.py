"""NVFP4 attention output projection: quantize bf16 activations to NVFP4 (static power-of-two fp32 global scale, dynamic e4m3 scale per 16 elements, round-to-nearest-even e2m1) and multiply by an NVFP4 weight whose 2688 output rows are zero-padded to 2816; returns bf16 [T,2688]."""
# Source: NVIDIA-Nemotron-3-Nano-30B-A3B config.json: hidden_size 2688, num_attention_heads 32,
# head_dim 128, so o_proj maps 32 * 128 = 4096 -> 2688; NVIDIA publishes an NVFP4 checkpoint of
# this model (ModelOpt NVFP4: static per-tensor activation scale "input_scale", weight global
# scale "weight_scale_2", e4m3 block scales per 16 elements).
# NVFP4 (NVIDIA's 4-bit format): e2m1 codes {0, .5, 1, 1.5, 2, 3, 4, 6} with a sign bit, two per
# byte (low nibble = even element), one float8_e4m3fn scale per 16 elements along K, one fp32
# per-tensor global scale: value = e2m1 * block_scale * global_scale.
# Workload: 32,768 tokens x 4096 -> 2688; the weight is stored padded to 2816 rows (22 x 128; the
# last 128 rows and their scales are zero), the output keeps the real 2688 columns.
# Semantics: block_scale = e4m3(amax16(x) / (6 g_x)) (saturating at 448); code = e2m1(x /
# (block_scale * g_x)), round to nearest even, saturating at 6; out = dequant(x_q) @
# dequant(W)^T in fp32, columns :2688, rounded to bf16.
# Exact decisions: g_x is a power of two (the calibrated amax / (6 * 448) rounded up to one), so
# block_scale * g_x is exact and, x being bf16, every ratio x / (block_scale * g_x) and
# amax16 / (6 g_x) is either exactly a rounding midpoint or far from one: the codes and scales are
# identical in fp32 and in the fp64 anchor. Exact midpoints are common (bf16 / e4m3 ratios), so
# the round-half-to-even tie rule is part of the definition.
# Fixed: shapes. Redrawn per draw: x (N(0,1) with per-channel spread, bf16), W (quantized here),
# g_x calibrated on x.
import torch

DTYPE = "nvfp4"
SOL = {
    "flops": 2 * 32768 * 4096 * 2688 + 8 * 32768 * 4096,
    "bytes": 2 * 32768 * 4096 + 4 + 2688 * 2048 + 2688 * 256 + 4 + 2 * 32768 * 2688,
}

N_REAL, N_PAD = 2688, 2816
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _e2m1_table(dtype, device):
    mag = torch.tensor(_E2M1, dtype=dtype, device=device)
    return torch.cat([mag, -mag])  # code = sign << 3 | magnitude index


def _dequant_codes(codes, scale, global_scale, cdt):
    """codes [..., K] (0..15), scale [..., K/16] e4m3, global_scale fp32 -> [..., K] in cdt."""
    vals = _e2m1_table(cdt, codes.device)[codes.long()].unflatten(-1, (-1, 16))
    block = scale.to(cdt) * global_scale.to(cdt)
    return (vals * block[..., None]).flatten(-2)


def _quant_codes(y, global_scale):
    """NVFP4 quantization of y [..., K]: (codes [..., K] uint8, block scales [..., K/16] e4m3)."""
    yb = y.unflatten(-1, (-1, 16))
    scale = (yb.abs().amax(-1) / (6.0 * global_scale)).clamp(max=448.0).to(torch.float8_e4m3fn)
    denom = scale.to(y.dtype) * global_scale
    r = yb / torch.where(denom == 0, torch.ones_like(denom), denom)[..., None]
    a = r.abs()
    ties_down = torch.tensor([0.25, 1.25, 2.5, 5.0], dtype=a.dtype, device=a.device)
    ties_up = torch.tensor([0.75, 1.75, 3.5], dtype=a.dtype, device=a.device)
    idx = torch.bucketize(a, ties_down) + torch.bucketize(a, ties_up, right=True)
    return (idx + 8 * (r < 0)).to(torch.uint8).flatten(-2), scale


def make_inputs(device="cuda", scale="full"):
    tokens, k, n_real, n_pad = (32768, 4096, N_REAL, N_PAD) if scale == "full" else (48, 256, 84, 96)
    spread = torch.exp(0.5 * torch.randn(k, device=device))
    x = (torch.randn(tokens, k, device=device) * spread).to(torch.bfloat16)
    w = torch.randn(n_real, k, device=device) / k ** 0.5
    w_global = w.abs().amax() / (6.0 * 448.0)
    codes, w_scale = _quant_codes(torch.cat([w, w.new_zeros(n_pad - n_real, k)]), w_global)
    w_packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    x_global = torch.exp2(torch.ceil(torch.log2(x.float().abs().amax() / (6.0 * 448.0))))
    return [x, x_global, w_packed, w_scale, w_global]


def reference(x, x_global, w_packed, w_scale, w_global):
    cdt = torch.promote_types(x.dtype, torch.float32)
    n_real = w_packed.shape[0] * N_REAL // N_PAD
    x_codes, x_scale = _quant_codes(x.to(cdt), x_global.to(cdt))
    xq = _dequant_codes(x_codes, x_scale, x_global, cdt)
    w_codes = torch.stack((w_packed & 0xF, w_packed >> 4), dim=-1).flatten(-2)
    w = _dequant_codes(w_codes, w_scale, w_global, cdt)
    return (xq @ w.T)[:, :n_real].to(x.dtype)
