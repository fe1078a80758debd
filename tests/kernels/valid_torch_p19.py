"""Valid: torch-only q/k RMSNorm + partial RoPE computed in fp32 (one rounding), q returned and k/v written into kv_cache in place.

Problem: p19
DSL: cutedsl
Device: cpu
Expected: passed
"""
import torch


def solve(qkv, positions, q_norm_weight, k_norm_weight, cos_sin_cache, slot_mapping, kv_cache, eps):
    tokens = qkv.shape[0]
    _, _, block_size, kv_heads, head_dim = kv_cache.shape
    x = qkv.float().view(tokens, -1, head_dim)
    heads = x.shape[1] - 2 * kv_heads
    cos, sin = cos_sin_cache[positions].float()[:, None, :].chunk(2, dim=-1)
    half = cos.shape[-1]

    def norm_rope(t, w):
        t = t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps) * w.float()
        a, b = t[..., :half], t[..., half:2 * half]
        return torch.cat([a * cos - b * sin, b * cos + a * sin, t[..., 2 * half:]], dim=-1)

    q = norm_rope(x[:, :heads], q_norm_weight).to(qkv.dtype)
    k = norm_rope(x[:, heads:heads + kv_heads], k_norm_weight).to(qkv.dtype)
    valid = slot_mapping >= 0
    s = slot_mapping[valid]
    kv_cache[0, s // block_size, s % block_size] = k[valid]
    kv_cache[1, s // block_size, s % block_size] = qkv.view(tokens, -1, head_dim)[:, heads + kv_heads:][valid]
    return q
