"""Quantize new key/value (bf16) to FP8 e4m3 with one dynamic scale per (token, head) = max(absmax/448, 1e-6) and append codes (as uint8) and fp32 scales in place into the paged caches at slot_mapping (skip -1); returns None."""
# Source: per-token-head dynamic FP8 KV-cache quantization as in vLLM (8 kv heads x 128, e.g.
# Llama-3.1-8B's kv side) in the shape of the original MetaKernelBench p21, taken from vLLM's
# per-token KV-cache quantization test: block size 16, 256 blocks. For each token t and head h,
# scale[t, h] = max(max_d |x[t, h, d]| / 448, 1e-6) (448 = largest finite float8_e4m3fn); the code
# is e4m3 of clamp(x * (1 / scale), -448, 448) (computed in fp32, round to nearest even), stored as
# its raw byte; the scale is stored in fp32 beside it (dequantize: code * scale).
# Layout: key, value [tokens, 8, 128] bf16; slot_mapping int64 [tokens], slot s -> block s // 16,
# offset s % 16, -1 = padding (not written); key_cache, value_cache uint8 [256, 16, 8, 128];
# k_scale_cache, v_scale_cache fp32 [256, 16, 8]. All four caches are updated in place (MUTATES);
# the original also returns them (the same tensors); here they are graded in place.
# Workload: 2,048 tokens, the last 1..128 (redrawn) padding. Fixed: shapes. Redrawn per draw: key
# and value ~ N(0, 1), the slots (distinct, random), the padding count, the prior caches (random
# bytes; scales uniform in 0.5..1.5).
# The codes are exact outputs, so make_inputs keeps every x / scale at least MARGIN of an e4m3 grid
# step away from a rounding midpoint (a value within the margin moves one bf16 ulp towards zero,
# which never changes the absmax); fp32 and fp64 arithmetic then give the same bytes. This moves a
# few values by one bf16 ulp relative to plain N(0, 1) draws; the original draws them unmoved.
import torch

DTYPE = "fp8"
EXACT = True
MARGIN = 1e-3
MUTATES = ("key_cache", "value_cache", "k_scale_cache", "v_scale_cache")
SOL = {
    "flops": 4 * 2 * 2048 * 8 * 128,
    "bytes": 2 * 2 * 2048 * 8 * 128 + 8 * 2048 + 2 * 2048 * 8 * 128 + 2 * 4 * 2048 * 8,
}

FP8_MAX = 448.0
MIN_SCALE = 1e-6


def _grid_distance(x):
    """Distance of x / scale from the nearest e4m3 rounding midpoint, in grid steps (0..0.5)."""
    xd = x.double()
    scale = (xd.abs().amax(dim=-1, keepdim=True) / FP8_MAX).clamp(min=MIN_SCALE)
    r = (xd / scale).abs().clamp(max=FP8_MAX)
    step = torch.exp2(torch.floor(torch.log2(r.clamp_min(2.0 ** -6))) - 3)
    return (torch.remainder(r / step, 1.0) - 0.5).abs()


def _keep_off_midpoints(x):
    """Move values within MARGIN of a rounding midpoint one bf16 ulp towards zero."""
    for _ in range(8):
        near = _grid_distance(x) < MARGIN
        if not bool(near.any()):
            return x
        x = torch.where(near, (x.view(torch.int16) - 1).view(torch.bfloat16), x)
    raise RuntimeError("could not move values off the e4m3 rounding midpoints")


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        tokens, heads, head_dim, blocks, block_size, max_pad = 2048, 8, 128, 256, 16, 128
    else:
        tokens, heads, head_dim, blocks, block_size, max_pad = 12, 2, 128, 6, 4, 3
    key = _keep_off_midpoints(torch.randn(tokens, heads, head_dim, device=device, dtype=torch.bfloat16))
    value = _keep_off_midpoints(torch.randn(tokens, heads, head_dim, device=device, dtype=torch.bfloat16))
    slot_mapping = torch.randperm(blocks * block_size, device=device)[:tokens]
    pad = int(torch.randint(1, max_pad + 1, (1,)).item())
    slot_mapping[tokens - pad:] = -1
    key_cache = torch.randint(0, 256, (blocks, block_size, heads, head_dim), device=device, dtype=torch.uint8)
    value_cache = torch.randint(0, 256, (blocks, block_size, heads, head_dim), device=device, dtype=torch.uint8)
    k_scale_cache = torch.rand(blocks, block_size, heads, device=device) + 0.5
    v_scale_cache = torch.rand(blocks, block_size, heads, device=device) + 0.5
    return [key, value, slot_mapping, key_cache, value_cache, k_scale_cache, v_scale_cache]


def decision_margin(key, value, slot_mapping, key_cache, value_cache, k_scale_cache, v_scale_cache):
    return min(float(_grid_distance(key).min()), float(_grid_distance(value).min()))


def _quantize(x):
    wide = x.to(torch.promote_types(x.dtype, torch.float32))
    scale = (wide.abs().amax(dim=-1) / FP8_MAX).clamp(min=MIN_SCALE)
    codes = (wide * (1.0 / scale[..., None])).clamp(-FP8_MAX, FP8_MAX)
    return codes.to(torch.float32).to(torch.float8_e4m3fn).view(torch.uint8), scale


def reference(key, value, slot_mapping, key_cache, value_cache, k_scale_cache, v_scale_cache):
    block_size = key_cache.shape[1]
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    block, offset = slots // block_size, slots % block_size
    for x, cache, scale_cache in ((key, key_cache, k_scale_cache), (value, value_cache, v_scale_cache)):
        codes, scale = _quantize(x[valid])
        cache[block, offset] = codes
        scale_cache[block, offset] = scale.to(scale_cache.dtype)
    return None
