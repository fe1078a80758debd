"""Split fused qkv (bf16), RMSNorm each q and k head (eps given), NeoX RoPE on the first 64 of 128 dims from cos_sin_cache[positions], write k and v into the paged kv_cache in place at slot_mapping (skip -1); return q."""
# Source: GLM-4.5's attention prologue (use_qk_norm: RMSNorm over each head's 128 dims with separate
# q and k weights; partial_rotary_factor 0.5, NeoX rotate-half over the first 64 dims, dims 64..127
# pass through) in the shape of the original MetaKernelBench p19, taken from vLLM's fused
# qk-norm + RoPE + KV-cache test: 32 q / 8 kv heads x 128, rotary dim 64, RoPE base 10,000 over
# 4,096 positions, eps 1e-5, block size 16.
# Layout: qkv [tokens, (32 + 8 + 8) * 128] (q heads, k heads, v heads); positions int64 [tokens];
# norm weights bf16 [128]; cos_sin_cache bf16 [4096, 64] = [cos(p f_i), i < 32 | sin(p f_i)],
# f_i = 10000^(-2i/64) (computed in fp32, rounded to bf16); slot_mapping int64 [tokens], slot s ->
# block s // 16, offset s % 16, -1 = padding (not written); kv_cache [2 (k, v), 256 blocks, 16, 8, 128];
# eps a Python float.
# Rounding as in the original: the norm is computed in fp32, rounded to bf16, multiplied by the bf16
# weight in bf16; the rotation runs in bf16 (cos/sin in the input dtype). q is returned; kv_cache is
# updated in place (MUTATES). The original also returns kv_cache, the same tensor; here it is graded
# in place and not returned again.
# Workload: 2,048 tokens, the last 1..128 (redrawn) padding; cache of 256 blocks x 16 slots.
# Fixed: shapes, eps, the cos/sin table. Redrawn per draw: qkv, both norm weights, the prior cache
# contents ~ N(0, 1); positions uniform in 0..4,095; the slots (distinct, random); the padding count.
import torch

DTYPE = "bf16"
MUTATES = ("kv_cache",)
SOL = {
    "flops": 2048 * 40 * 128 * 4 + 2048 * 40 * 64 * 3,
    "bytes": 2 * 2048 * 48 * 128 + 8 * 2048 + 2 * 2 * 128 + 2 * 2048 * 64 + 8 * 2048
    + 2 * 2048 * 32 * 128 + 2 * 2 * 2048 * 8 * 128,
}

EPS = 1e-5
ROPE_BASE = 10000.0


def _cos_sin_cache(max_position, rotary_dim, device):
    inv_freq = 1.0 / ROPE_BASE ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32, device=device) / rotary_dim)
    angles = torch.outer(torch.arange(max_position, dtype=torch.float32, device=device), inv_freq)
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(torch.bfloat16)


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        tokens, heads, kv_heads, head_dim, blocks, block_size, max_pos, max_pad = 2048, 32, 8, 128, 256, 16, 4096, 128
    else:
        tokens, heads, kv_heads, head_dim, blocks, block_size, max_pos, max_pad = 12, 4, 2, 128, 6, 4, 64, 3
    bf16 = torch.bfloat16
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, device=device, dtype=bf16)
    positions = torch.randint(0, max_pos, (tokens,), device=device)
    q_norm_weight = torch.randn(head_dim, device=device, dtype=bf16)
    k_norm_weight = torch.randn(head_dim, device=device, dtype=bf16)
    cos_sin_cache = _cos_sin_cache(max_pos, head_dim // 2, device)
    slot_mapping = torch.randperm(blocks * block_size, device=device)[:tokens]
    pad = int(torch.randint(1, max_pad + 1, (1,)).item())
    slot_mapping[tokens - pad:] = -1
    kv_cache = torch.randn(2, blocks, block_size, kv_heads, head_dim, device=device, dtype=bf16)
    return [qkv, positions, q_norm_weight, k_norm_weight, cos_sin_cache, slot_mapping, kv_cache, EPS]


def _head_rms_norm(x, weight, eps):
    wide = x.to(torch.promote_types(x.dtype, torch.float32))
    normed = wide * torch.rsqrt(wide.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (normed.to(weight.dtype) * weight).to(x.dtype)


def _partial_neox_rope(x, cos, sin):
    half = cos.shape[-1]
    x1, x2 = x[..., :half], x[..., half:2 * half]
    cos, sin = cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., 2 * half:]], dim=-1)


def reference(qkv, positions, q_norm_weight, k_norm_weight, cos_sin_cache, slot_mapping, kv_cache, eps):
    tokens = qkv.shape[0]
    _, _, block_size, kv_heads, head_dim = kv_cache.shape
    heads = qkv.shape[1] // head_dim - 2 * kv_heads
    q, k, v = qkv.view(tokens, -1, head_dim).split([heads, kv_heads, kv_heads], dim=1)
    cos, sin = cos_sin_cache[positions].chunk(2, dim=-1)
    q = _partial_neox_rope(_head_rms_norm(q, q_norm_weight, eps), cos, sin)
    k = _partial_neox_rope(_head_rms_norm(k, k_norm_weight, eps), cos, sin)
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    block, offset = slots // block_size, slots % block_size
    kv_cache[0, block, offset] = k[valid]
    kv_cache[1, block, offset] = v[valid]
    return q
