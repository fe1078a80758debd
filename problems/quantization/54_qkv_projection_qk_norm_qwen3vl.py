"""FP8 block-scaled Q/K/V projections with biases and per-head RMSNorm on q and k, quantization inside: x (bf16) quantized per token per 128 channels and each weight per 128x128 block, y = dequant(x) @ dequant(W.T) + b rounded to bf16; returns q [B,60,S,128], k [B,8,S,128], v [B,8,S,128] (bf16)."""
# Source: Qwen3-VL-style attention (Qwen3 applies an RMSNorm over head_dim to every q and k head
# before RoPE) in fine-grained FP8 (e4m3 weights with 128x128 block scales, dynamic per-token,
# per-128-channel activation scales). Dims as the original gives them: hidden 7680, 60 q heads and
# 8 kv heads of 128, q/k/v projections with bias.
# Original (MetaKernelBench p54): inputs (hidden_states [64, 256, 7680], q/k/v weights [7680 or
# 1024, 7680], q/k/v biases, q_norm_weight, k_norm_weight, eps 1e-5); 3 outputs.
# Semantics: for each projection x is quantized (scale = amax(1 x 128 block) / 448,
# q = e4m3(v / scale)) and W.T likewise in 128 x 128 blocks; y = dequant(x) @ dequant(W.T) + b in
# fp32 (fp64 in the anchor), rounded to bf16; q and k viewed [B, S, heads, 128] are RMS-normalised
# (statistics in fp32, normalised value rounded to bf16, times the bf16 weight); all three are
# returned head-major [B, heads, S, 128] (our reading of the recipe's transposes).
# Workload: 64 sequences x 256 tokens = 16,384 tokens.
# Fixed: shapes, eps. Redrawn per draw: x (N(0,1)), weights (N(0,1)/sqrt(7680) times a
# per-128x128-block gain U(0.5, 2)), biases (N(0,1)), norm weights (1 + 0.1 N), all bf16.
import torch

DTYPE = "fp8"
SOL = {
    "flops": 2 * 16384 * 7680 * 9728 + 8 * 16384 * 8704,
    "bytes": 2 * 16384 * 7680 + 2 * 9728 * 7680 + 2 * 9728 + 2 * 2 * 128 + 2 * 16384 * 9728,
}

BLOCK = 128
E4M3_MAX = 448.0
HEAD_DIM = 128
EPS = 1e-5


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
    b, s, hidden, hq, hkv = (64, 256, 7680, 60, 8) if scale == "full" else (2, 24, 256, 4, 2)
    bf = torch.bfloat16
    x = torch.randn(b, s, hidden, device=device, dtype=bf)
    weights = [_weight(h * HEAD_DIM, hidden, device) for h in (hq, hkv, hkv)]
    biases = [torch.randn(h * HEAD_DIM, device=device, dtype=bf) for h in (hq, hkv, hkv)]
    q_norm = (1 + 0.1 * torch.randn(HEAD_DIM, device=device)).to(bf)
    k_norm = (1 + 0.1 * torch.randn(HEAD_DIM, device=device)).to(bf)
    return [x, *weights, *biases, q_norm, k_norm, EPS]


def _project(x2, weight, bias, compute):
    y = _dequantized(x2.to(compute), 1, BLOCK) @ _dequantized(weight.to(compute).T.contiguous(), BLOCK, BLOCK)
    return (y + bias.to(compute)).to(x2.dtype)


def _rms_norm(t, weight, eps, compute):
    h = t.to(compute)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(t.dtype)


def reference(x, q_weight, k_weight, v_weight, q_bias, k_bias, v_bias, q_norm_weight, k_norm_weight, eps):
    compute = torch.promote_types(x.dtype, torch.float32)
    b, s, hidden = x.shape
    x2 = x.reshape(-1, hidden)
    q = _project(x2, q_weight, q_bias, compute).view(b, s, -1, HEAD_DIM)
    k = _project(x2, k_weight, k_bias, compute).view(b, s, -1, HEAD_DIM)
    v = _project(x2, v_weight, v_bias, compute).view(b, s, -1, HEAD_DIM)
    q = _rms_norm(q, q_norm_weight, eps, compute)
    k = _rms_norm(k, k_norm_weight, eps, compute)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
