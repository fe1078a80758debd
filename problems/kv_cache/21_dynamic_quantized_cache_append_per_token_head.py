"""Quantize new key/value (bf16) to FP8 e4m3 with one dynamic scale per (token, head) = absmax/448 and append them to paged uint8 caches and fp32 scale caches at slot_mapping (skip -1); return the four updated caches."""
# Source: Llama-3.1-8B config.json: num_key_value_heads 8, head_dim 128 (the kv side of one
# layer). Dynamic per-(token, head) FP8 KV-cache quantization: for each token t and kv head h,
# scale[t, h] = max_d |x[t, h, d]| / 448 (448 = largest finite float8_e4m3fn), the stored code is
# round-to-nearest-even e4m3 of clamp(x / scale, -448, 448), kept as its raw byte (uint8), and the
# fp32 scale is stored beside it (dequantize: code * scale).
# Layout: key, value [tokens, 8, 128] bf16; k_cache, v_cache uint8 [num_blocks, 16, 8, 128];
# k_scale_cache, v_scale_cache fp32 [num_blocks, 16, 8]; slot_mapping int64 [tokens],
# slot s -> block s // 16, offset s % 16, -1 = padding (not written).
# Workload: 2,048 tokens (the last 1..64, redrawn, are padding) into a cache of 512 blocks x 16.
# Fixed: shapes. Redrawn per draw: key and value (N(0, 1) times a per-(token, head) magnitude
# exp(N(0, 1)/2)), the number of padding tokens, the slots (distinct, random), and the prior cache
# contents (random bytes, random positive scales). The inputs are not modified: the caches are
# returned as fresh updated copies.
# The stored bytes are exact outputs, so make_inputs keeps every x / scale at least MARGIN of an
# e4m3 grid step away from a rounding midpoint (values within the margin are moved one bf16 ulp
# towards zero, which leaves the absmax unchanged); fp32 and fp64 arithmetic then give the same
# bytes.
import torch

DTYPE = "fp8"
SOL = {
    "flops": 4 * 2 * 2048 * 8 * 128,
    "bytes": 2 * 2 * 2048 * 8 * 128 + 8 * 2048 + 2 * 2 * 512 * 16 * 8 * 128 + 2 * 2 * 4 * 512 * 16 * 8,
}
EXACT = True
MARGIN = 1e-3

FP8_MAX = 448.0
MIN_AMAX = 1e-6


def _grid_distance(x):
    """Distance of x / (absmax / 448) from the nearest e4m3 rounding midpoint, in grid steps (0..0.5)."""
    xd = x.double()
    amax = xd.abs().amax(dim=-1, keepdim=True).clamp_min(MIN_AMAX)
    r = (xd / (amax / FP8_MAX)).abs()
    exponent = torch.floor(torch.log2(r.clamp_min(2.0 ** -6)))
    step = torch.exp2(exponent - 3)
    frac = torch.remainder(r / step, 1.0)
    return (frac - 0.5).abs()


def _keep_off_midpoints(x):
    """Move values that sit within MARGIN of a rounding midpoint one bf16 ulp towards zero."""
    for _ in range(8):
        near = _grid_distance(x) < MARGIN
        if not bool(near.any()):
            return x
        bits = x.view(torch.int16)
        x = torch.where(near, (bits - 1).view(torch.bfloat16), x)
    raise RuntimeError("could not move values off the e4m3 rounding midpoints")


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        tokens, heads, head_dim, blocks, block_size, max_pad = 2048, 8, 128, 512, 16, 64
    else:
        tokens, heads, head_dim, blocks, block_size, max_pad = 12, 2, 128, 6, 4, 3
    inputs = []
    for _ in range(2):
        magnitude = torch.exp(0.5 * torch.randn(tokens, heads, 1, device=device))
        x = (torch.randn(tokens, heads, head_dim, device=device) * magnitude).to(torch.bfloat16)
        inputs.append(_keep_off_midpoints(x))
    key, value = inputs
    k_cache = torch.randint(0, 256, (blocks, block_size, heads, head_dim), dtype=torch.uint8, device=device)
    v_cache = torch.randint(0, 256, (blocks, block_size, heads, head_dim), dtype=torch.uint8, device=device)
    k_scale_cache = torch.rand(blocks, block_size, heads, device=device) * 0.01 + 1e-3
    v_scale_cache = torch.rand(blocks, block_size, heads, device=device) * 0.01 + 1e-3
    pad = int(torch.randint(1, max_pad + 1, (1,)).item())
    slot_mapping = torch.full((tokens,), -1, dtype=torch.int64, device=device)
    slot_mapping[: tokens - pad] = torch.randperm(blocks * block_size, device=device)[: tokens - pad]
    return [key, value, k_cache, v_cache, k_scale_cache, v_scale_cache, slot_mapping]


def decision_margin(key, value, k_cache, v_cache, k_scale_cache, v_scale_cache, slot_mapping):
    return min(float(_grid_distance(key).min()), float(_grid_distance(value).min()))


def _quantize(x, compute):
    xc = x.to(compute)
    scale = xc.abs().amax(dim=-1, keepdim=True).clamp_min(MIN_AMAX) / FP8_MAX
    codes = (xc / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    return codes, scale.squeeze(-1)


def reference(key, value, k_cache, v_cache, k_scale_cache, v_scale_cache, slot_mapping):
    compute = torch.promote_types(key.dtype, torch.float32)
    blocks, block_size, heads, head_dim = k_cache.shape
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    caches, scale_caches = [], []
    for x, cache, scale_cache in ((key, k_cache, k_scale_cache), (value, v_cache, v_scale_cache)):
        codes, scale = _quantize(x[valid], compute)
        new_cache = cache.clone()
        new_cache.view(blocks * block_size, heads, head_dim)[slots] = codes
        new_scales = scale_cache.clone()
        new_scales.view(blocks * block_size, heads)[slots] = scale.to(scale_cache.dtype)
        caches.append(new_cache)
        scale_caches.append(new_scales)
    return caches[0], caches[1], scale_caches[0], scale_caches[1]
