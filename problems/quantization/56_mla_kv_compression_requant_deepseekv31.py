"""MLA KV path with mid-chain FP8 requantization: FP8 block-scaled down-projection to the 512-wide latent + 64-wide rope key, RMSNorm of the latent, per-token-per-128 e4m3 requantization with power-of-two (UE8M0) scales, FP8 up-projection to 128 heads of k_nope and v; returns bf16 k_nope [T,128,128], v [T,128,128], k_pe [T,64]."""
# Source: DeepSeek-V3.1 config.json: hidden_size 7168, kv_lora_rank 512, qk_rope_head_dim 64,
# qk_nope_head_dim 128, v_head_dim 128, num_attention_heads 128, rms_norm_eps 1e-6;
# quantization_config: fp8 e4m3, weight_block_size [128, 128], activation_scheme dynamic,
# scale_fmt "ue8m0" (every scale is a power of two). kv_a_proj_with_mqa maps 7168 -> 512 + 64
# = 576 rows (4.5 blocks of 128: its block-scale grid is padded to 5 x 128 = 640 rows);
# kv_a_layernorm is an RMSNorm over the 512 latent channels; kv_b_proj maps 512 -> 128 heads x
# (128 k_nope + 128 v) = 32768 rows.
# Workload: 64 sequences x 256 tokens = 16,384 tokens of prefill.
# Semantics (what a fused kernel computes): x = x_fp8 * x_scale (per token, per 128 channels);
# kv = x @ Wa^T (fp32 accumulate; Wa dequantized per 128x128 block); c = kv[:, :512],
# k_pe = kv[:, 512:]; c = RMSNorm(c) * kv_norm_weight (eps 1e-6, fp32); c is requantized per token
# per 128 channels: s = 2^ceil(log2(amax / 448)), c_q = e4m3(c / s) (round to nearest even);
# kv_b = (c_q * s) @ Wb^T; split per head into k_nope | v. Outputs are rounded to bf16 once.
# Requantization robustness: the scales are powers of two, so c / s is exact and a code differs
# between the fp32 run and the fp64 anchor only where c itself sits within rounding error of an
# e4m3 rounding midpoint (about 1e-6 of the codes); such a flip moves one of the 512 terms of a
# dot product by one e4m3 step (<= 1/8 relative), well inside the bf16 output tolerance.
# Fixed: shapes, eps. Redrawn per draw: hidden states (N(0,1) with per-channel spread), weights
# (N(0, 1/fan_in)), all quantized here with UE8M0 scales; norm weight 1 + 0.1 N(0,1).
import torch

DTYPE = "fp8"
SOL = {
    "flops": 2 * 16384 * 7168 * 576 + 2 * 16384 * 512 * 32768 + 8 * 16384 * 512,
    "bytes": 16384 * 7168 + 4 * 16384 * 56 + 576 * 7168 + 4 * 5 * 56 + 2 * 512 + 32768 * 512
    + 4 * 256 * 4 + 2 * 16384 * (128 * 256 + 64),
}

LORA, ROPE, HEADS, NOPE, VDIM, EPS, BLK = 512, 64, 128, 128, 128, 1e-6, 128
_FP8_MAX = 448.0


def _ue8m0(amax):
    """Smallest power of two s with amax / s <= 448."""
    return torch.exp2(torch.ceil(torch.log2(amax.clamp(min=1e-30) / _FP8_MAX)))


def _quant_act(x):
    """Per-row, per-128-channel e4m3 quantization with power-of-two scales."""
    xb = x.unflatten(-1, (-1, BLK))
    scale = _ue8m0(xb.abs().amax(-1))
    q = (xb / scale[..., None]).clamp(-_FP8_MAX, _FP8_MAX).to(torch.float8_e4m3fn)
    return q.flatten(-2), scale


def _quant_weight(w):
    """Per-128x128-block e4m3 quantization with power-of-two scales (rows padded to 128)."""
    n, k = w.shape
    nb = -(-n // BLK)
    wp = torch.cat([w, w.new_zeros(nb * BLK - n, k)]) if nb * BLK != n else w
    wb = wp.view(nb, BLK, k // BLK, BLK)
    scale = _ue8m0(wb.abs().amax(dim=(1, 3)))
    q = (wb / scale[:, None, :, None]).clamp(-_FP8_MAX, _FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(nb * BLK, k)[:n].contiguous(), scale


def _dequant_weight(w_fp8, scale, cdt):
    n, k = w_fp8.shape
    row_scale = scale.to(cdt).repeat_interleave(BLK, dim=0)[:n]
    return (w_fp8.to(cdt).view(n, k // BLK, BLK) * row_scale[..., None]).view(n, k)


def make_inputs(device="cuda", scale="full"):
    tokens, hidden, heads = (16384, 7168, HEADS) if scale == "full" else (40, 384, 2)
    spread = torch.exp(0.5 * torch.randn(hidden, device=device))
    x = torch.randn(tokens, hidden, device=device) * spread
    wa = torch.randn(LORA + ROPE, hidden, device=device) / hidden ** 0.5
    wb = torch.randn(heads * (NOPE + VDIM), LORA, device=device) / LORA ** 0.5
    x_fp8, x_scale = _quant_act(x)
    wa_fp8, wa_scale = _quant_weight(wa)
    wb_fp8, wb_scale = _quant_weight(wb)
    kv_norm_weight = (1 + 0.1 * torch.randn(LORA, device=device)).to(torch.bfloat16)
    return [x_fp8, x_scale, wa_fp8, wa_scale, kv_norm_weight, wb_fp8, wb_scale]


def reference(x_fp8, x_scale, wa_fp8, wa_scale, kv_norm_weight, wb_fp8, wb_scale):
    cdt = torch.promote_types(x_scale.dtype, torch.float32)
    out_dtype = kv_norm_weight.dtype
    t, k = x_fp8.shape
    x = (x_fp8.to(cdt).view(t, k // BLK, BLK) * x_scale.to(cdt)[..., None]).view(t, k)
    kv = x @ _dequant_weight(wa_fp8, wa_scale, cdt).T
    c, k_pe = kv.split([LORA, ROPE], dim=-1)
    c = c * torch.rsqrt(c.pow(2).mean(-1, keepdim=True) + EPS) * kv_norm_weight.to(cdt)
    cb = c.view(t, LORA // BLK, BLK)
    s = _ue8m0(cb.abs().amax(-1))
    c_q = (cb / s[..., None]).clamp(-_FP8_MAX, _FP8_MAX).to(torch.float8_e4m3fn)
    c_hat = (c_q.to(cdt) * s[..., None]).view(t, LORA)
    kvb = (c_hat @ _dequant_weight(wb_fp8, wb_scale, cdt).T).view(t, -1, NOPE + VDIM)
    k_nope, v = kvb.split([NOPE, VDIM], dim=-1)
    return k_nope.to(out_dtype), v.to(out_dtype), k_pe.to(out_dtype)
