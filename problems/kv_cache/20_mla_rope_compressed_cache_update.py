"""DeepSeek MLA prologue (bf16): q = q_c @ q_b_weight.T per head split into nope 128 + rope 64, NeoX RoPE from cos_sin_cache[positions] on q's rope part and on the shared k_pe; write [kv_c 512 | rotated k_pe 64] into the paged kv_cache in place at slot_mapping (skip -1); return q [tokens, 16, 192]."""
# Source: DeepSeek-V3 MLA (q_lora_rank 1536, kv_lora_rank 512, qk_nope_head_dim 128,
# qk_rope_head_dim 64; 128 heads, 16 per GPU at tensor parallel 8) in the shape of the original
# MetaKernelBench p20, taken from vLLM's MLA RoPE + KV-cache concat fusion test: RoPE base 10,000
# over 4,096 positions with NeoX rotate-half pairing (i, i + 32), block size 16.
# Layout: qkv_lora [tokens, 1536 + 512 + 64] = [q_c | kv_c | k_pe] (the low-rank projections'
# outputs); q_b_weight [16 * 192, 1536] (head-major, each head nope 128 then rope 64); positions
# int64; cos_sin_cache bf16 [4096, 64] = [cos(p f_i), i < 32 | sin(p f_i)], f_i = 10000^(-2i/64)
# (computed in fp32, rounded to bf16); slot_mapping int64 [tokens], slot s -> block s // 16, offset
# s % 16, -1 = padding (not written); kv_cache [256 blocks, 16, 1, 576].
# Rounding as in the original: the q GEMM in the input dtype (fp32 accumulation), the rotations in
# bf16 (cos/sin in the input dtype); kv_c is cached unchanged (no norm here). q is returned;
# kv_cache is updated in place (MUTATES). The original also returns kv_cache, the same tensor; here
# it is graded in place and not returned again.
# Workload: 2,048 tokens, the last 1..128 (redrawn) padding; cache of 256 blocks x 16 slots.
# Fixed: shapes, the cos/sin table. Redrawn per draw: qkv_lora and the prior cache ~ N(0, 1),
# q_b_weight ~ 0.02 N(0, 1), positions uniform in 0..4,095, the slots (distinct, random), padding.
import torch
import torch.nn.functional as F

DTYPE = "bf16"
MUTATES = ("kv_cache",)
SOL = {
    "flops": 2 * 2048 * 1536 * 3072 + 2048 * (16 + 1) * 64 * 3,
    "bytes": 2 * 2048 * 2112 + 2 * 3072 * 1536 + 8 * 2048 + 2 * 2048 * 64 + 8 * 2048
    + 2 * 2048 * 3072 + 2 * 2048 * 576,
}

HEADS, NOPE, ROPE, KV_RANK, Q_RANK = 16, 128, 64, 512, 1536
ROPE_BASE = 10000.0


def _cos_sin_cache(max_position, device):
    inv_freq = 1.0 / ROPE_BASE ** (torch.arange(0, ROPE, 2, dtype=torch.float32, device=device) / ROPE)
    angles = torch.outer(torch.arange(max_position, dtype=torch.float32, device=device), inv_freq)
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(torch.bfloat16)


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        tokens, blocks, block_size, max_pos, max_pad = 2048, 256, 16, 4096, 128
    else:
        tokens, blocks, block_size, max_pos, max_pad = 10, 4, 4, 64, 3
    bf16 = torch.bfloat16
    qkv_lora = torch.randn(tokens, Q_RANK + KV_RANK + ROPE, device=device, dtype=bf16)
    q_b_weight = torch.randn(HEADS * (NOPE + ROPE), Q_RANK, device=device, dtype=bf16) * 0.02
    positions = torch.randint(0, max_pos, (tokens,), device=device)
    cos_sin_cache = _cos_sin_cache(max_pos, device)
    slot_mapping = torch.randperm(blocks * block_size, device=device)[:tokens]
    pad = int(torch.randint(1, max_pad + 1, (1,)).item())
    slot_mapping[tokens - pad:] = -1
    kv_cache = torch.randn(blocks, block_size, 1, KV_RANK + ROPE, device=device, dtype=bf16)
    return [qkv_lora, q_b_weight, positions, cos_sin_cache, slot_mapping, kv_cache]


def _neox_rope(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def reference(qkv_lora, q_b_weight, positions, cos_sin_cache, slot_mapping, kv_cache):
    tokens = qkv_lora.shape[0]
    block_size = kv_cache.shape[1]
    q_c, kv_c, k_pe = qkv_lora.split([Q_RANK, KV_RANK, ROPE], dim=-1)
    q_nope, q_pe = F.linear(q_c, q_b_weight).view(tokens, HEADS, NOPE + ROPE).split([NOPE, ROPE], dim=-1)
    cos, sin = cos_sin_cache[positions].chunk(2, dim=-1)
    q = torch.cat([q_nope, _neox_rope(q_pe, cos[:, None, :], sin[:, None, :])], dim=-1)
    k_pe = _neox_rope(k_pe, cos, sin)
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    block, offset = slots // block_size, slots % block_size
    kv_cache[block, offset, 0] = torch.cat([kv_c[valid], k_pe[valid]], dim=-1)
    return q
