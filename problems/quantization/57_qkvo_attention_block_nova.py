"""NVFP4 attention block: NVFP4 QKV projection of pre-quantized activations, RoPE, causal GQA softmax attention in fp32 (64 q / 8 kv heads x 128), NVFP4 requantization of the attention output with a static global scale, NVFP4 output projection; returns bf16 [B,S,8192]."""
# Source: the slot names Amazon Nova, whose architecture is not public; we keep the slot's
# dimensions, which are those of Llama-3.1-70B (config.json: hidden_size 8192,
# num_attention_heads 64, num_key_value_heads 8, head_dim 128, rope_theta 500000; rotate-half
# RoPE over the whole head; no llama3 frequency rescaling here).
# NVFP4 (NVIDIA's 4-bit format): e2m1 codes {0, .5, 1, 1.5, 2, 3, 4, 6} with a sign bit, two per
# byte (low nibble = even element), one float8_e4m3fn scale per 16 elements along K, one fp32
# per-tensor global scale: value = e2m1 * block_scale * global_scale. Quantizing y with global
# scale g: block_scale = e4m3(amax16(y) / (6 g)) (saturating at 448), code = e2m1(y / (block_scale
# * g)) rounded to nearest even (saturating at 6). Activation global scales are static
# (calibrated, as ModelOpt's input_scale); block scales are dynamic.
# Workload: 64 sequences x 128 tokens (positions 0..127), 8,192 tokens; Wqkv [10240, 8192] with
# rows q (64 heads) | k (8) | v (8), Wo [8192, 8192].
# Semantics: qkv = dequant(x) @ dequant(Wqkv)^T (fp32); RoPE on q, k; o = softmax(q k^T / sqrt(128)
# + causal mask) v per sequence, q head h reading kv head h // 8 (fp32); o is quantized to NVFP4
# with the static global scale o_global (the fused kernel's requantization), then
# out = dequant(o_q) @ dequant(Wo)^T, rounded to bf16 once.
# Requantization robustness: o_global is a power of two, so block_scale * o_global is exact and a
# code can differ between the fp32 run and the fp64 anchor only where o itself (~1e-6 relative
# apart in the two runs) straddles a rounding midpoint: at full scale about 700 of the 67M codes
# and 50 of the 4.2M block scales; each moves a few of the 8192 terms of an output dot product,
# and the largest effect seen (with the bf16 rounding) was 0.4% of max|out|, against a
# tolerance of at least 2.3% (3 x bf16 eps x max|out|). Ties round half to even.
# Fixed: shapes, RoPE base. Redrawn per draw: activations, weights (quantized here); o_global is
# calibrated per draw from the amax of the attention values v (an upper bound of |o|), rounded up
# to a power of two.
import torch

DTYPE = "nvfp4"
SOL = {
    "flops": 2 * 8192 * 8192 * 10240 + 2 * 8192 * 8192 * 8192 + 4 * 64 * 64 * 128 * 129 // 2 * 128
    + 5 * 64 * 64 * 128 * 129 // 2,
    "bytes": 8192 * 4096 + 8192 * 512 + 10240 * 4096 + 10240 * 512 + 8192 * 4096 + 8192 * 512
    + 4 * 4 + 2 * 8192 * 8192,
}

D, GROUP, THETA = 128, 8, 500000.0
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


def _quant_tensor(x, global_scale=None):
    if global_scale is None:
        global_scale = x.abs().amax() / (6.0 * 448.0)
    codes, scale = _quant_codes(x, global_scale)
    return codes[..., 0::2] | (codes[..., 1::2] << 4), scale, global_scale


def _rope(x, cdt):
    """Rotate-half RoPE over the last dim of x [B, S, H, D] at positions 0..S-1."""
    s = x.shape[1]
    inv_freq = THETA ** (-torch.arange(0, D, 2, dtype=cdt, device=x.device) / D)
    ang = torch.arange(s, dtype=cdt, device=x.device)[:, None] * inv_freq
    cos, sin = ang.cos()[None, :, None], ang.sin()[None, :, None]
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def make_inputs(device="cuda", scale="full"):
    batch, seq, hidden, hq = (64, 128, 8192, 64) if scale == "full" else (2, 16, 256, 8)
    hkv = hq // GROUP
    x = torch.randn(batch * seq, hidden, device=device)
    wqkv = torch.randn((hq + 2 * hkv) * D, hidden, device=device) / hidden ** 0.5
    wo = torch.randn(hidden, hq * D, device=device) / (hq * D) ** 0.5
    x_p, x_s, x_g = _quant_tensor(x)
    wqkv_p, wqkv_s, wqkv_g = _quant_tensor(wqkv)
    wo_p, wo_s, wo_g = _quant_tensor(wo)
    # Static activation scale for the o_proj input, calibrated on the attention values v.
    wv = _dequant_nvfp4(wqkv_p[-hkv * D:], wqkv_s[-hkv * D:], wqkv_g, torch.float32)
    v_amax = (_dequant_nvfp4(x_p, x_s, x_g, torch.float32) @ wv.T).abs().amax()
    o_global = torch.exp2(torch.ceil(torch.log2(v_amax / (6.0 * 448.0))))
    x_p, x_s = x_p.view(batch, seq, -1), x_s.view(batch, seq, -1)
    return [x_p, x_s, x_g, wqkv_p, wqkv_s, wqkv_g, o_global, wo_p, wo_s, wo_g]


def reference(x_p, x_s, x_g, wqkv_p, wqkv_s, wqkv_g, o_global, wo_p, wo_s, wo_g):
    cdt = torch.promote_types(x_g.dtype, torch.float32)
    out_dtype = torch.bfloat16 if x_g.dtype != torch.float64 else torch.float64
    b, s = x_p.shape[:2]
    n_heads = wqkv_p.shape[0] // D
    hkv = n_heads // (GROUP + 2)
    hq = GROUP * hkv
    x = _dequant_nvfp4(x_p, x_s, x_g, cdt)
    qkv = (x @ _dequant_nvfp4(wqkv_p, wqkv_s, wqkv_g, cdt).T).view(b, s, n_heads, D)
    q, k, v = qkv.split([hq, hkv, hkv], dim=2)
    q, k = _rope(q, cdt), _rope(k, cdt)
    q = q.transpose(1, 2).unflatten(1, (hkv, hq // hkv))  # [b, hkv, g, s, D]
    k = k.transpose(1, 2)[:, :, None]
    v = v.transpose(1, 2)[:, :, None]
    scores = (q @ k.transpose(-1, -2)) * D ** -0.5
    causal = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
    p = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
    o = (p @ v).flatten(1, 2).transpose(1, 2).reshape(b, s, hq * D)
    codes, o_scale = _quant_codes(o, o_global.to(cdt))
    o_hat = _dequant_codes(codes, o_scale, o_global, cdt)
    out = o_hat @ _dequant_nvfp4(wo_p, wo_s, wo_g, cdt).T
    return out.to(out_dtype)
