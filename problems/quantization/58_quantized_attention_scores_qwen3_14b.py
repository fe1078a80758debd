"""Causal GQA attention probabilities from NVFP4 q and k (packed e2m1 uint8 + e4m3 scale per 16 head-dim elements + fp32 global scale): P = softmax(q k^T / sqrt(128)) with a causal mask, 40 q heads over 8 kv heads; returns bf16 P [B,40,S,S]."""
# Source: Qwen3-14B config.json: hidden_size 5120, num_attention_heads 40, num_key_value_heads 8,
# head_dim 128 (q head h reads kv head h // 5).
# NVFP4 (NVIDIA's 4-bit format): e2m1 codes {0, .5, 1, 1.5, 2, 3, 4, 6} with a sign bit, two per
# byte (low nibble = even element), one float8_e4m3fn scale per 16 consecutive elements along the
# contraction dim (here head_dim: 8 scales per head vector), one fp32 per-tensor global scale:
# value = e2m1 * block_scale * global_scale. q and k arrive quantized (normed and rotated upstream).
# Workload: 64 sequences x 256 tokens; P is [64, 40, 256, 256] (masked entries are exactly 0).
# Semantics: scores = dequant(q) dequant(k)^T / sqrt(128) in fp32, -inf above the diagonal,
# softmax over keys in fp32, rounded to bf16 once.
# Fixed: shapes. Redrawn per draw: q, k (N(0,1) with per-dim spread, quantized here).
import torch

DTYPE = "nvfp4"
SOL = {
    "flops": 2 * 64 * 40 * (256 * 257 // 2) * 128 + 5 * 64 * 40 * (256 * 257 // 2),
    "bytes": 64 * 256 * 40 * 64 + 64 * 256 * 40 * 8 + 64 * 256 * 8 * 64 + 64 * 256 * 8 * 8 + 2 * 4
    + 2 * 64 * 40 * 256 * 256,
}

D = 128
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
    batch, seq, hq, hkv = (64, 256, 40, 8) if scale == "full" else (2, 24, 5, 1)
    spread = torch.exp(0.4 * torch.randn(D, device=device))
    q = torch.randn(batch, seq, hq, D, device=device) * spread
    k = torch.randn(batch, seq, hkv, D, device=device) * spread
    q_p, q_s, q_g = _quant_tensor(q)
    k_p, k_s, k_g = _quant_tensor(k)
    return [q_p, q_s, q_g, k_p, k_s, k_g]


def reference(q_p, q_s, q_g, k_p, k_s, k_g):
    cdt = torch.promote_types(q_g.dtype, torch.float32)
    out_dtype = torch.bfloat16 if q_g.dtype != torch.float64 else torch.float64
    b, s, hq = q_p.shape[:3]
    hkv = k_p.shape[2]
    q = _dequant_nvfp4(q_p, q_s, q_g, cdt).permute(0, 2, 1, 3).unflatten(1, (hkv, hq // hkv))
    k = _dequant_nvfp4(k_p, k_s, k_g, cdt).permute(0, 2, 1, 3)[:, :, None]
    scores = (q @ k.transpose(-1, -2)) * D ** -0.5  # [b, hkv, group, s, s]
    causal = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
    p = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
    return p.flatten(1, 2).to(out_dtype)
