"""NVFP4-quantized GQA attention core: q and k (bf16) quantized to NVFP4 along head_dim for the score GEMM, scores * 128^-0.5 + additive causal mask, softmax in fp32 rounded to bf16, then P (along keys) and V^T (along tokens) quantized for the P @ V GEMM; returns (attn_output bf16 [B,40,S,128], attn_weights bf16 [B,40,S,S])."""
# Source: Qwen3-14B config.json: num_attention_heads 40, num_key_value_heads 8, head_dim 128
# (q head h reads kv head h // 5).
# NVFP4 (NVIDIA's 4-bit format): e2m1 codes {0, .5, 1, 1.5, 2, 3, 4, 6} with a sign bit, two per
# byte (low nibble = even element), one e4m3 scale per 16 consecutive elements along K, one fp32
# global decode scale per tensor: value = e2m1 * block_scale * global_decode. Quantizing t: global
# encode g = 448 * 6 / amax(t); block_scale = e4m3(amax16 / 6 * g) (at most 448);
# code = e2m1(t * g / block_scale), round half to even, saturating at 6; global decode = 1 / g.
# Original (MetaKernelBench p58): inputs (query_states [64, 40, 256, 128], key_states and
# value_states [64, 8, 256, 128], attention_mask [64, 1, 256, 256] with the bf16 minimum above the
# diagonal), all bf16; 2 outputs.
# Semantics: k, v repeated to 40 heads; each quantized operand ([B*40, S, 128] for q and k,
# P [B*40, S, S] and V^T [B*40, 128, S]) has one global scale; the dequantized products are taken in
# fp32 (fp64 in the anchor) and rounded to bf16; scores = QK^T (bf16) * 128^-0.5 + mask; P =
# softmax in fp32 rounded to bf16 (returned as attn_weights); attn_output = P V rounded to bf16.
# Workload: 64 sequences x 256 tokens.
# Fixed: shapes. Redrawn per draw: q, k, v (N(0,1), bf16); the mask is fixed.
import torch

DTYPE = "nvfp4"
SOL = {
    "flops": 2 * 2 * 64 * 40 * 256 * 256 * 128 + 5 * 64 * 40 * 256 * 256,
    "bytes": 2 * (64 * 40 * 256 * 128 + 2 * 64 * 8 * 256 * 128 + 64 * 256 * 256) + 2 * 64 * 40 * 256 * 128
    + 2 * 64 * 40 * 256 * 256,
}

HEAD_DIM = 128
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
    batch, seq, hq, hkv = (64, 256, 40, 8) if scale == "full" else (2, 32, 5, 1)
    bf = torch.bfloat16
    q = torch.randn(batch, hq, seq, HEAD_DIM, device=device, dtype=bf)
    k = torch.randn(batch, hkv, seq, HEAD_DIM, device=device, dtype=bf)
    v = torch.randn(batch, hkv, seq, HEAD_DIM, device=device, dtype=bf)
    mask = torch.zeros(batch, 1, seq, seq, device=device, dtype=bf)
    causal = torch.ones(seq, seq, dtype=torch.bool, device=device).triu(1)
    mask[:, :, causal] = torch.finfo(bf).min
    return [q, k, v, mask]


def _mm(a, b, compute):
    """dequant(NVFP4(a)) @ dequant(NVFP4(b))^T for a [N, M, K], b [N, P, K], each with one global scale."""
    pa, sa, ga = _nvfp4_quantize(a.to(compute).contiguous())
    pb, sb, gb = _nvfp4_quantize(b.to(compute).contiguous())
    return _nvfp4_dequantize(pa, sa, ga, compute) @ _nvfp4_dequantize(pb, sb, gb, compute).transpose(1, 2)


def reference(q, k, v, mask):
    compute = torch.promote_types(q.dtype, torch.float32)
    b, hq, s, d = q.shape
    group = hq // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = _mm(q.reshape(-1, s, d), k.reshape(-1, s, d), compute).to(q.dtype).view(b, hq, s, s)
    scores = scores * d ** -0.5 + mask
    probs = torch.softmax(scores, dim=-1, dtype=compute).to(q.dtype)
    out = _mm(probs.reshape(-1, s, s), v.reshape(-1, s, d).transpose(1, 2), compute).to(q.dtype)
    return out.view(b, hq, s, d), probs
