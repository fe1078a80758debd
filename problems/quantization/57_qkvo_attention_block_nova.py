"""NVFP4 attention block: Q/K/V projections of dynamically NVFP4-quantized activations with pre-quantized NVFP4 weights (rounded to bf16), rotate-half RoPE with given cos/sin, causal GQA attention in bf16 with an fp32 softmax (64 q / 8 kv heads x 128), NVFP4 output projection; returns bf16 [B,S,8192]."""
# Source: the slot names Amazon Nova, whose architecture is not public; dims as the original gives
# them (those of Llama-3.1-70B: hidden 8192, 64 q heads, 8 kv heads, head dim 128).
# NVFP4 (NVIDIA's 4-bit format): e2m1 codes {0, .5, 1, 1.5, 2, 3, 4, 6} with a sign bit, two per
# byte (low nibble = even element), one e4m3 scale per 16 consecutive elements along K, one fp32
# global decode scale per tensor: value = e2m1 * block_scale * global_decode. Quantizing t: global
# encode g = 448 * 6 / amax(t); block_scale = e4m3(amax16 / 6 * g) (at most 448);
# code = e2m1(t * g / block_scale), round half to even, saturating at 6; global decode = 1 / g.
# Original (MetaKernelBench p57): inputs (hidden_states [64, 128, 8192], cos, sin [64, 128, 128],
# then codes, block scales and global decode scale of W_q [8192, 8192], W_k, W_v [1024, 8192] and
# W_o [8192, 8192]); 15 inputs, 1 output.
# Semantics: each projection quantizes its input (flattened to [tokens, K]) with its own global
# scale, multiplies the dequantized operands in fp32 (fp64 in the anchor) and rounds to bf16;
# q, k get RoPE x * cos + rotate_half(x) * sin (rotate_half(x) = [-x2, x1]); k and v are repeated to
# the 64 q heads; scores = q k^T / sqrt(128) (bf16), causal mask, softmax in fp32 rounded to bf16,
# o = P v (bf16); o goes through the NVFP4 output projection.
# Workload: 64 sequences x 128 tokens = 8,192 tokens.
# Fixed: shapes. Redrawn per draw: x, cos, sin (N(0,1), bf16, as the original draws them); weights
# N(0,1)/sqrt(fan_in), quantized here.
import torch

DTYPE = "nvfp4"
SOL = {
    "flops": 2 * 8192 * 8192 * (8192 + 2048 + 8192) + 2 * 2 * 64 * 64 * 128 * 128 * 128,
    "bytes": 2 * 8192 * 8192 + 2 * 2 * 8192 * 128 + (8192 + 2048 + 8192) * (4096 + 512) + 4 * 4
    + 2 * 8192 * 8192,
}

HEAD_DIM, KV_GROUP = 128, 8
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
    batch, seq, hidden, hq = (64, 128, 8192, 64) if scale == "full" else (2, 16, 256, 8)
    hkv = hq // KV_GROUP
    bf = torch.bfloat16
    x = torch.randn(batch, seq, hidden, device=device, dtype=bf)
    cos = torch.randn(batch, seq, HEAD_DIM, device=device, dtype=bf)
    sin = torch.randn(batch, seq, HEAD_DIM, device=device, dtype=bf)
    weights = []
    for rows, cols in ((hq * HEAD_DIM, hidden), (hkv * HEAD_DIM, hidden), (hkv * HEAD_DIM, hidden), (hidden, hq * HEAD_DIM)):
        weights += _nvfp4_quantize(torch.randn(rows, cols, device=device) / cols ** 0.5)
    return [x, cos, sin, *weights]


def _project(t, packed, scale, global_decode, compute):
    lead = t.shape[:-1]
    a_packed, a_scale, a_global = _nvfp4_quantize(t.reshape(-1, t.shape[-1]).to(compute))
    a = _nvfp4_dequantize(a_packed, a_scale, a_global, compute)
    y = a @ _nvfp4_dequantize(packed, scale, global_decode, compute).T
    return y.to(t.dtype).view(*lead, -1)


def _rope(t, cos, sin):
    half = t.shape[-1] // 2
    return t * cos + torch.cat([-t[..., half:], t[..., :half]], dim=-1) * sin


def reference(x, cos, sin, q_packed, q_scale, q_global, k_packed, k_scale, k_global, v_packed, v_scale, v_global,
              o_packed, o_scale, o_global):
    compute = torch.promote_types(x.dtype, torch.float32)
    b, s, _ = x.shape
    q = _project(x, q_packed, q_scale, q_global, compute).view(b, s, -1, HEAD_DIM).transpose(1, 2)
    k = _project(x, k_packed, k_scale, k_global, compute).view(b, s, -1, HEAD_DIM).transpose(1, 2)
    v = _project(x, v_packed, v_scale, v_global, compute).view(b, s, -1, HEAD_DIM).transpose(1, 2)
    q, k = _rope(q, cos[:, None], sin[:, None]), _rope(k, cos[:, None], sin[:, None])
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = (q @ k.transpose(2, 3)) * HEAD_DIM ** -0.5
    causal = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
    probs = torch.softmax(scores.masked_fill(causal, float("-inf")), dim=-1, dtype=compute).to(q.dtype)
    o = (probs @ v).transpose(1, 2).reshape(b, s, -1)
    return _project(o, o_packed, o_scale, o_global, compute)
