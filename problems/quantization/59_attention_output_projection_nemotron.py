"""NVFP4 attention output projection: bf16 activations quantized to NVFP4 inside (dynamic global scale) times a pre-quantized NVFP4 weight of 2816 output rows (hidden 2688 padded to 2816); returns the fp32 product [32768, 2816]."""
# Source: NVIDIA Nemotron (Nemotron-3-Nano: hidden_size 2688, 32 attention heads x 128, so o_proj
# maps 4096 -> 2688; the original pads the output dim to 2816 = 22 x 128).
# NVFP4 (NVIDIA's 4-bit format): e2m1 codes {0, .5, 1, 1.5, 2, 3, 4, 6} with a sign bit, two per
# byte (low nibble = even element), one e4m3 scale per 16 consecutive elements along K, one fp32
# global decode scale per tensor: value = e2m1 * block_scale * global_decode. Quantizing t: global
# encode g = 448 * 6 / amax(t); block_scale = e4m3(amax16 / 6 * g) (at most 448);
# code = e2m1(t * g / block_scale), round half to even, saturating at 6; global decode = 1 / g.
# Original (MetaKernelBench p59): inputs (hidden_states [32768, 4096], weight codes [2816, 2048],
# weight block scales [2816, 256], weight global decode scale); all 2816 output columns returned.
# Semantics: the activations get their own global scale per call; the dequantized operands are
# multiplied in fp32 (fp64 in the anchor) and the product is returned as it is, in fp32, as the
# original's does (its siblings p55, p57 and p61 cast to the activations' dtype; p59 does not).
# Workload: 64 sequences x 512 tokens = 32,768 tokens, 4096 -> 2816.
# Fixed: shapes. Redrawn per draw: x (N(0,1), bf16); W (0.02 N(0,1), all 2816 rows, quantized here).
import torch

DTYPE = "nvfp4"
SOL = {
    "flops": 2 * 32768 * 4096 * 2816 + 8 * 32768 * 4096,
    "bytes": 2 * 32768 * 4096 + 2816 * 2048 + 2816 * 256 + 4 + 4 * 32768 * 2816,
}
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
    tokens, k, n = (32768, 4096, 2816) if scale == "full" else (48, 256, 96)
    x = torch.randn(tokens, k, device=device, dtype=torch.bfloat16)
    w_packed, w_scale, w_global = _nvfp4_quantize(0.02 * torch.randn(n, k, device=device))
    return [x, w_packed, w_scale, w_global]


def reference(x, w_packed, w_scale, w_global):
    compute = torch.promote_types(x.dtype, torch.float32)
    a_packed, a_scale, a_global = _nvfp4_quantize(x.to(compute))
    a = _nvfp4_dequantize(a_packed, a_scale, a_global, compute)
    return a @ _nvfp4_dequantize(w_packed, w_scale, w_global, compute).T
