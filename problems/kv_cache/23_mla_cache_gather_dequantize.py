"""Gather each request's tokens from a paged FP8 e4m3 MLA cache (block_table, cu_seq_lens) into one contiguous buffer and dequantize them with the scalar scale: out[t] = float(cache[block, offset]) * scale, fp32 [tokens, 576]."""
# Source: DeepSeek-V3 config.json: kv_lora_rank 512, qk_rope_head_dim 64, so one MLA cache entry is
# 576 values (512 compressed kv + 64 rope key), shared by all heads. With an FP8 KV cache the
# entries are stored as float8_e4m3fn with one per-tensor scale; before the prefill attention over
# cached context the context tokens are gathered out of the paged cache into a dense buffer and
# dequantized.
# Layout: kv_cache float8_e4m3fn [1024 blocks, 16, 576]; block_table int32 [8, 128] (entries past a
# request's last block are 0 and never read); cu_seq_lens int32 [9] (request r owns output rows
# cu_seq_lens[r] .. cu_seq_lens[r+1]-1; its token i lives in block block_table[r, i // 16] at offset
# i % 16); scale fp32 [1] (0.1).
# Workload: 8 requests, 4,096 tokens in all (lengths a random split, each >= 1). Fixed: shapes,
# total tokens, scale 0.1. Redrawn per draw: cache contents (e4m3 of 4 N(0, 1)), the lengths and
# the blocks (distinct, random among the 1,024).
# SOL bytes count the cache entries actually gathered (4,096 x 576), not the whole pool.
import torch

DTYPE = "fp8"
SOL = {
    "flops": 4096 * 576,
    "bytes": 4096 * 576 + 4 * 8 * 128 + 4 * 9 + 4 + 4 * 4096 * 576,
}


def _split(total, parts, device):
    """Random lengths >= 1 that sum to total."""
    cuts = torch.randperm(total - 1, device=device)[: parts - 1] + 1
    bounds = torch.cat([torch.zeros(1, dtype=torch.int64, device=device), cuts.sort().values,
                        torch.full((1,), total, dtype=torch.int64, device=device)])
    return bounds.diff()


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        blocks, block_size, requests, tokens, width = 1024, 16, 8, 4096, 128
    else:
        blocks, block_size, requests, tokens, width = 16, 4, 3, 20, 8
    kv_cache = (4 * torch.randn(blocks, block_size, 576, device=device)).to(torch.float8_e4m3fn)
    lengths = _split(tokens, requests, device)
    while int(lengths.max()) > width * block_size:
        lengths = _split(tokens, requests, device)
    cu_seq_lens = torch.cat([torch.zeros(1, dtype=torch.int64, device=device), lengths.cumsum(0)]).to(torch.int32)
    needed = (lengths + block_size - 1) // block_size
    pool = torch.randperm(blocks, device=device)
    block_table = torch.zeros(requests, width, dtype=torch.int32, device=device)
    start = 0
    for r, n in enumerate(needed.tolist()):
        block_table[r, :n] = pool[start:start + n].to(torch.int32)
        start += n
    scale_t = torch.full((1,), 0.1, dtype=torch.float32, device=device)
    return [kv_cache, block_table, cu_seq_lens, scale_t]


def reference(kv_cache, block_table, cu_seq_lens, scale):
    compute = torch.promote_types(scale.dtype, torch.float32)
    blocks, block_size, width = kv_cache.shape
    tokens = int(cu_seq_lens[-1])
    token = torch.arange(tokens, device=kv_cache.device)
    request = torch.searchsorted(cu_seq_lens[1:].long(), token, right=True)
    position = token - cu_seq_lens.long()[request]
    block = block_table.long()[request, position // block_size]
    # index the raw bytes: gathers are not defined for float8 on every backend
    entries = kv_cache.view(torch.uint8)[block, position % block_size].view(torch.float8_e4m3fn)
    return entries.to(compute) * scale.to(compute)
