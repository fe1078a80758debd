"""NVFP4 SwiGLU MLP with mid-chain requantization: NVFP4 gate/up GEMM of pre-quantized activations, h = silu(gate) * up in fp32, h requantized to NVFP4 (static power-of-two global scale, dynamic e4m3 scale per 16, round-to-nearest-even e2m1), NVFP4 down GEMM; returns bf16 [B,S,4096]."""
# Source: Qwen3-8B config.json: hidden_size 4096, intermediate_size 12288, hidden_act silu;
# gate_proj and up_proj are fused into one [2 * 12288, 4096] weight (rows gate | up), down_proj is
# [4096, 12288]. NVFP4 (NVIDIA's 4-bit format): e2m1 codes {0, .5, 1, 1.5, 2, 3, 4, 6} with a sign
# bit, two per byte (low nibble = even element), one float8_e4m3fn scale per 16 elements along K,
# one fp32 per-tensor global scale: value = e2m1 * block_scale * global_scale. Activation global
# scales are static (ModelOpt's calibrated input_scale); block scales are dynamic.
# Workload: 32 sequences x 512 tokens = 16,384 tokens.
# Semantics (what the fused kernel computes): gu = dequant(x) @ dequant(Wgu)^T in fp32;
# h = silu(gu[:, :12288]) * gu[:, 12288:] in fp32; h is quantized with the static global scale
# g_h: block_scale = e4m3(amax16(h) / (6 g_h)) (saturating at 448), code = e2m1(h / (block_scale *
# g_h)) round half to even, saturating at 6; out = dequant(h_q) @ dequant(Wd)^T in fp32, bf16 once.
# Requantization robustness: g_h is a power of two, so block_scale * g_h is exact and a code can
# differ between the fp32 run and the fp64 anchor only where h itself (~1e-6 relative apart in
# the two runs: K = 4096 fp32 accumulations) straddles a rounding midpoint. At full scale that
# is ~1000 of the 201M codes and ~200 of the 12.6M block scales; a flipped block scale re-rounds
# all 16 values of its block. Measured at full scale (H200, 7 draws), as a share of max|out|: the
# reference's own error 0.8-1.6% (bf16 rounding alone ~0.3%); an fp32 kernel with another
# summation order 0.75-1.5%; a kernel rounding gate/up to bf16 before the activation 2.9-3.6%;
# leaving h unquantized ~10% (measured on a reduced shape). TOLERANCE factor 6 accepts the first
# two and rejects the last.
# Fixed: shapes. Redrawn per draw: x (N(0,1)), weights (N(0, 1/fan_in)), all quantized here; g_h is
# calibrated per draw on h (its amax / (6 * 448), rounded up to a power of two).
import torch

DTYPE = "nvfp4"
TOLERANCE = {
    "factor": 6.0,
    "reason": "mid-chain NVFP4 requantization: h differs from the fp64 anchor by ~1e-6 relative, so"
              " ~1000 codes and ~200 e4m3 block scales (each re-rounding 16 values) flip at rounding"
              " midpoints: the reference errs by 0.8-1.6% of max|out|, an fp32 kernel with another"
              " summation order by 0.75-1.5%, one with bf16 gate/up by 2.9-3.6%; skipping the"
              " requantization errs by ~10% and still fails.",
}
SOL = {
    "flops": 2 * 16384 * 4096 * 24576 + 2 * 16384 * 12288 * 4096 + 6 * 16384 * 12288,
    "bytes": 16384 * 2048 + 16384 * 256 + 4 + 24576 * 2048 + 24576 * 256 + 4 + 4
    + 4096 * 6144 + 4096 * 768 + 4 + 2 * 16384 * 4096,
}

_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _e2m1_table(dtype, device):
    mag = torch.tensor(_E2M1, dtype=dtype, device=device)
    return torch.cat([mag, -mag])  # code = sign << 3 | magnitude index


def _dequant_codes(codes, scale, global_scale, cdt):
    """codes [..., K] (0..15), scale [..., K/16] e4m3, global_scale fp32 -> [..., K] in cdt."""
    vals = _e2m1_table(cdt, codes.device)[codes.long()].unflatten(-1, (-1, 16))
    block = scale.to(cdt) * global_scale.to(cdt)
    return (vals * block[..., None]).flatten(-2)


def _dequant_nvfp4(packed, scale, global_scale, cdt):
    """packed [..., K/2] uint8 (low nibble first) -> [..., K] in cdt."""
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)
    return _dequant_codes(codes, scale, global_scale, cdt)


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


def _quant_tensor(x):
    global_scale = x.abs().amax() / (6.0 * 448.0)
    codes, scale = _quant_codes(x, global_scale)
    return codes[..., 0::2] | (codes[..., 1::2] << 4), scale, global_scale


def _gate_up(x_p, x_s, x_g, wgu_p, wgu_s, wgu_g, cdt):
    x = _dequant_nvfp4(x_p, x_s, x_g, cdt)
    gate, up = (x @ _dequant_nvfp4(wgu_p, wgu_s, wgu_g, cdt).T).chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def make_inputs(device="cuda", scale="full"):
    batch, seq, hidden, inter = (32, 512, 4096, 12288) if scale == "full" else (2, 16, 128, 384)
    x = torch.randn(batch, seq, hidden, device=device)
    wgu = torch.randn(2 * inter, hidden, device=device) / hidden ** 0.5
    wd = torch.randn(hidden, inter, device=device) / inter ** 0.5
    x_p, x_s, x_g = _quant_tensor(x)
    wgu_p, wgu_s, wgu_g = _quant_tensor(wgu)
    wd_p, wd_s, wd_g = _quant_tensor(wd)
    h_amax = _gate_up(x_p, x_s, x_g, wgu_p, wgu_s, wgu_g, torch.float32).abs().amax()
    h_global = torch.exp2(torch.ceil(torch.log2(h_amax / (6.0 * 448.0))))
    return [x_p, x_s, x_g, wgu_p, wgu_s, wgu_g, h_global, wd_p, wd_s, wd_g]


def reference(x_p, x_s, x_g, wgu_p, wgu_s, wgu_g, h_global, wd_p, wd_s, wd_g):
    cdt = torch.promote_types(x_g.dtype, torch.float32)
    out_dtype = torch.bfloat16 if x_g.dtype != torch.float64 else torch.float64
    h = _gate_up(x_p, x_s, x_g, wgu_p, wgu_s, wgu_g, cdt)
    codes, h_scale = _quant_codes(h, h_global.to(cdt))
    h_hat = _dequant_codes(codes, h_scale, h_global, cdt)
    return (h_hat @ _dequant_nvfp4(wd_p, wd_s, wd_g, cdt).T).to(out_dtype)
