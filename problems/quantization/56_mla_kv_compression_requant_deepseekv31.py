"""MLA KV path with FP8 quantization inside and a mid-chain requantization: x (bf16) and W_a quantized (1x128 / 128x128 e4m3 blocks), kv = x @ W_a.T to 640 columns rounded to bf16, RMSNorm of the 512 latent columns, the normed latent requantized and multiplied by quantized W_b.T to 128 heads x 256; returns bf16 k_nope [B,S,128,128] and v [B,S,128,128]."""
# Source: DeepSeek-V3.1 config.json: hidden_size 7168, kv_lora_rank 512, qk_rope_head_dim 64,
# qk_nope_head_dim 128, v_head_dim 128, num_attention_heads 128, rms_norm_eps 1e-6; fine-grained FP8
# (e4m3, 128x128 weight blocks, dynamic activation scales). kv_a_proj_with_mqa maps 7168 -> 512 + 64
# = 576 rows, padded to 640 (5 blocks of 128); kv_b_proj maps 512 -> 128 x (128 + 128).
# Original (MetaKernelBench p56): inputs (hidden_states [64, 256, 7168], kv_a_proj_weight
# [640, 7168], kv_a_layernorm_weight [512], kv_b_proj_weight [32768, 512], eps), quantized inside;
# 2 outputs (k_nope, value).
# Semantics: e4m3 quantization with scale = amax(block) / 448, q = e4m3(v / scale): x in 1 x 128
# blocks, W_a.T and W_b.T in 128 x 128 blocks; products in fp32 (fp64 in the anchor).
# kv = dequant(x) @ dequant(W_a.T) rounded to bf16; c = kv[:, :512]; c = weight * RMSNorm(c) (fp32
# statistics, normalised value rounded to bf16, times the bf16 weight); c is requantized (1 x 128)
# and kv_b = dequant(c) @ dequant(W_b.T), rounded to bf16, viewed [B, S, 128, 256] and split into
# k_nope | v.
# Workload: 64 sequences x 256 tokens = 16,384 tokens of prefill.
# Fixed: shapes, eps 1e-6. Redrawn per draw: x (N(0,1)); weights N(0,1)/sqrt(fan_in) times a
# per-128x128-block gain U(0.5, 2); norm weight 1 + 0.1 N(0,1); all bf16.
import torch

DTYPE = "fp8"
SOL = {
    "flops": 2 * 16384 * 7168 * 640 + 2 * 16384 * 512 * 32768 + 8 * 16384 * 512,
    "bytes": 2 * 16384 * 7168 + 2 * 640 * 7168 + 2 * 512 + 2 * 32768 * 512 + 2 * 16384 * 32768,
}

BLOCK = 128
E4M3_MAX = 448.0
LORA, HEADS, NOPE = 512, 128, 128
EPS = 1e-6


def _dequantized(t, rows, cols):
    """Blockwise e4m3 quantize-dequantize of t [R, C] in rows x cols blocks (scale = amax / 448)."""
    r, c = t.shape
    blocks = t.view(r // rows, rows, c // cols, cols)
    scale = blocks.abs().amax(dim=(1, 3), keepdim=True).clamp(min=1e-12) / E4M3_MAX
    codes = (blocks / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return (codes.to(t.dtype) * scale).view(r, c)


def _weight(n, k, device):
    gain = torch.rand(n // BLOCK, k // BLOCK, device=device) * 1.5 + 0.5
    w = torch.randn(n, k, device=device) / k ** 0.5
    return (w * gain.repeat_interleave(BLOCK, dim=0).repeat_interleave(BLOCK, dim=1)).to(torch.bfloat16)


def make_inputs(device="cuda", scale="full"):
    b, s, hidden, heads = (64, 256, 7168, HEADS) if scale == "full" else (2, 20, 384, 2)
    bf = torch.bfloat16
    x = torch.randn(b, s, hidden, device=device, dtype=bf)
    w_a = _weight(640, hidden, device)
    norm_w = (1 + 0.1 * torch.randn(LORA, device=device)).to(bf)
    w_b = _weight(heads * 2 * NOPE, LORA, device)
    return [x, w_a, norm_w, w_b, EPS]


def _gemm(a, w, compute):
    return (_dequantized(a.to(compute), 1, BLOCK) @ _dequantized(w.to(compute).T.contiguous(), BLOCK, BLOCK)).to(a.dtype)


def reference(x, w_a, norm_w, w_b, eps):
    compute = torch.promote_types(x.dtype, torch.float32)
    b, s, hidden = x.shape
    kv = _gemm(x.reshape(-1, hidden), w_a, compute)
    c = kv[:, :LORA].to(compute)
    c = norm_w * (c * torch.rsqrt(c.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    kvb = _gemm(c, w_b, compute).view(b, s, -1, 2 * NOPE)
    return kvb[..., :NOPE], kvb[..., NOPE:]
