"""FP8 block-scaled QKV projection with per-head RMSNorm on q and k: e4m3 activations (fp32 scale per token per 128 channels) times e4m3 weights (fp32 scale per 128x128 block), returning bf16 q [T,64,128], k [T,8,128], v [T,8,128]."""
# Source: Qwen3-VL-32B text model config.json: hidden_size 5120, num_attention_heads 64,
# num_key_value_heads 8, head_dim 128, rms_norm_eps 1e-6; Qwen3 attention applies an RMSNorm over
# head_dim to every q head (q_norm) and k head (k_norm) before RoPE. Qwen3-VL FP8 checkpoints use
# fine-grained e4m3 weights (weight_block_size [128, 128], one fp32 dequant scale per block) and
# dynamic activation quantization (one fp32 scale per token per 128 channels).
# Workload: 64 sequences x 256 tokens = 16,384 tokens; fused qkv weight [(64+8+8)*128, 5120] =
# [10240, 5120], rows ordered q | k | v. Slot change: the slot lists hidden 7680 with 60 q heads,
# which matches no Qwen3-VL config; we use Qwen3-VL-32B (hidden 5120, 64 q heads) with the slot's
# token count, kv heads and head_dim.
# Semantics: x = x_fp8 * x_scale (per token, per 128 channels), W = w_fp8 * w_scale (per 128x128
# block), qkv = x @ W^T accumulated in fp32; q and k are RMS-normalised per head (eps 1e-6) and
# scaled by q_norm_weight / k_norm_weight; v is returned as is. Outputs rounded to bf16 once.
# Fixed: shapes, eps. Redrawn per draw: activations (N(0,1) with per-channel spread) and weights
# (N(0, 0.02^2)), both quantized here to e4m3 with their scales; norm weights 1 + 0.1 N(0,1).
import torch

DTYPE = "fp8"
SOL = {
    "flops": 2 * 16384 * 5120 * 10240 + 8 * 16384 * 9216,
    "bytes": 16384 * 5120 + 4 * 16384 * 40 + 10240 * 5120 + 4 * 80 * 40 + 2 * 2 * 128
    + 2 * 16384 * 10240,
}

HQ, HKV, D, EPS, BLK = 64, 8, 128, 1e-6, 128
_FP8_MAX = 448.0


def _quant_act(x):
    """Per-token, per-128-channel e4m3 quantization with fp32 dequant scales."""
    t, k = x.shape
    xb = x.view(t, k // BLK, BLK)
    scale = xb.abs().amax(-1).clamp(min=1e-12) / _FP8_MAX
    q = (xb / scale[..., None]).clamp(-_FP8_MAX, _FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(t, k), scale


def _quant_weight(w):
    """Per-128x128-block e4m3 quantization with fp32 dequant scales."""
    n, k = w.shape
    wb = w.view(n // BLK, BLK, k // BLK, BLK)
    scale = wb.abs().amax(dim=(1, 3)).clamp(min=1e-12) / _FP8_MAX
    q = (wb / scale[:, None, :, None]).clamp(-_FP8_MAX, _FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(n, k), scale


def make_inputs(device="cuda", scale="full"):
    tokens, hidden = (16384, 5120) if scale == "full" else (48, 256)
    hq, hkv = (HQ, HKV) if scale == "full" else (8, 1)
    n = (hq + 2 * hkv) * D
    spread = torch.exp(0.5 * torch.randn(hidden, device=device))
    x = torch.randn(tokens, hidden, device=device) * spread
    w = 0.02 * torch.randn(n, hidden, device=device)
    x_fp8, x_scale = _quant_act(x)
    w_fp8, w_scale = _quant_weight(w)
    q_norm_weight = (1 + 0.1 * torch.randn(D, device=device)).to(torch.bfloat16)
    k_norm_weight = (1 + 0.1 * torch.randn(D, device=device)).to(torch.bfloat16)
    return [x_fp8, x_scale, w_fp8, w_scale, q_norm_weight, k_norm_weight]


def _rms_norm(x, weight, cdt):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * weight.to(cdt)


def reference(x_fp8, x_scale, w_fp8, w_scale, q_norm_weight, k_norm_weight):
    cdt = torch.promote_types(x_scale.dtype, torch.float32)
    t, k = x_fp8.shape
    n = w_fp8.shape[0]
    x = (x_fp8.to(cdt).view(t, k // BLK, BLK) * x_scale.to(cdt)[..., None]).view(t, k)
    w = w_fp8.to(cdt).view(n // BLK, BLK, k // BLK, BLK) * w_scale.to(cdt)[:, None, :, None]
    qkv = x @ w.view(n, k).T
    n_kv = n // D // 10  # q : k : v heads = 8 : 1 : 1 (64 : 8 : 8)
    q, kk, v = qkv.view(t, n // D, D).split([8 * n_kv, n_kv, n_kv], dim=1)
    out_dtype = q_norm_weight.dtype
    q = _rms_norm(q, q_norm_weight, cdt)
    kk = _rms_norm(kk, k_norm_weight, cdt)
    return q.to(out_dtype), kk.to(out_dtype), v.to(out_dtype).contiguous()
