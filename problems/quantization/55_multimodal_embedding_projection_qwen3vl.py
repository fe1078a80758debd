"""Multimodal input embedding: gather bf16 token embeddings and overwrite each sequence's vision-token positions (a boolean mask, 384 per sequence, in position order) with an NVFP4 projection of its vision features (features quantized inside, weight given as packed e2m1 + e4m3 block-16 scales + global scale) plus bias; bf16 [32,1024,8192]."""
# Source: Qwen3-VL-style multimodal embedding (the language model's input is the token embedding,
# with projected vision features scattered into the image positions). Dims as the original gives
# them: batch 32 x 1024 tokens, 384 vision tokens per sequence, text hidden 8192, vocab 151,936,
# vision hidden 3584.
# NVFP4 (NVIDIA's 4-bit format): e2m1 codes {0, .5, 1, 1.5, 2, 3, 4, 6} with a sign bit, two per
# byte (low nibble = even element), one e4m3 scale per 16 consecutive elements along K, one fp32
# global decode scale per tensor: value = e2m1 * block_scale * global_decode.
# Quantizing t: global encode g = 448 * 6 / amax(t); block_scale = e4m3(amax16 / 6 * g) (at most
# 448); code = e2m1(t * g / block_scale), round half to even, saturating at 6; global decode = 1 / g.
# Original (MetaKernelBench p55): inputs (input_ids, embedding table, vision_features, weight codes,
# weight scales, weight global decode, vision_proj_bias, vision_token_mask); the vision features
# are quantized inside the reference with their own global scale.
# Semantics: out = table[ids]; the vision features [32 * 384, 3584] are quantized, projected
# (dequantized operands multiplied in fp32, fp64 in the anchor), rounded to bf16, the bf16 bias
# added; sequence b's 384 rows go, in order, to the positions where the mask is true.
# Fixed: shapes. Redrawn per draw: ids (uniform over the vocabulary), table (N(0,1)), features
# (N(0,1)), weight (N(0,1)/sqrt(3584), quantized here), bias (N(0,1)), all bf16 but the packed
# weight; the mask marks 384 random positions of each sequence.
import torch

DTYPE = "nvfp4"
SOL = {
    "flops": 2 * 12288 * 3584 * 8192 + 12288 * 8192,
    "bytes": 8 * 32 * 1024 + 2 * 32768 * 8192 + 2 * 12288 * 3584 + 8192 * 1792 + 8192 * 224 + 4 + 2 * 8192
    + 32 * 1024 + 2 * 32768 * 8192,
}

VOCAB = 151936
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
    if scale == "full":
        batch, seq, n_vis, hidden, k = 32, 1024, 384, 8192, 3584
    else:
        batch, seq, n_vis, hidden, k = 3, 40, 12, 64, 96
    bf = torch.bfloat16
    ids = torch.randint(0, VOCAB, (batch, seq), device=device)
    table = torch.randn(VOCAB, hidden, device=device, dtype=bf)
    features = torch.randn(batch, n_vis, k, device=device, dtype=bf)
    w_packed, w_scale, w_global = _nvfp4_quantize(torch.randn(hidden, k, device=device) / k ** 0.5)
    bias = torch.randn(hidden, device=device, dtype=bf)
    mask = torch.zeros(batch, seq, dtype=torch.bool, device=device)
    for b in range(batch):
        mask[b, torch.randperm(seq, device=device)[:n_vis]] = True
    return [ids, table, features, w_packed, w_scale, w_global, bias, mask]


def reference(ids, table, features, w_packed, w_scale, w_global, bias, mask):
    compute = torch.promote_types(table.dtype, torch.float32)
    a_packed, a_scale, a_global = _nvfp4_quantize(features.reshape(-1, features.shape[-1]).to(compute))
    a = _nvfp4_dequantize(a_packed, a_scale, a_global, compute)
    w = _nvfp4_dequantize(w_packed, w_scale, w_global, compute)
    vision = (a @ w.T).to(table.dtype) + bias
    out = table[ids]
    out[mask] = vision  # row-major over (sequence, position): each sequence's rows in position order
    return out
