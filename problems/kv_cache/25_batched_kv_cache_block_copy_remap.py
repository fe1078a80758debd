"""Paged KV-cache block copy: for each row (src, dst) of block_mapping copy block src to block dst in both uint8 caches; return the updated copies (key_cache, value_cache)."""
# Source: the copy-on-write block copy of paged KV caches (a forked sequence, e.g. beam search or
# parallel sampling, gets its own copy of a shared last block before writing to it). Cache layout
# [num_blocks, block_size, num_kv_heads, head_dim] with fp8 entries stored as raw bytes (uint8),
# 8 kv heads x 256 head dim (the geometry of a 256-wide-head model such as Gemma-2/3 at 8 kv heads).
# Workload: 1,024 blocks x 32 tokens x 8 heads x 256 bytes per cache (64 MiB each, K and V),
# 256 (src, dst) pairs. Destinations are distinct and never sources, so the result does not
# depend on copy order; a source may feed several destinations (one block forked many ways).
# Fixed: shapes, number of pairs. Redrawn per draw: cache bytes, the mapping.
# The inputs are not modified: the answer is a fresh updated copy of each cache.
import torch

DTYPE = "uint8"
EXACT = True
SOL = {"flops": 0, "bytes": 2 * 2 * 1024 * 32 * 8 * 256 + 256 * 2 * 8}


def make_inputs(device="cuda", scale="full"):
    blocks, block_size, heads, head_dim, pairs = (1024, 32, 8, 256, 256) if scale == "full" else (16, 4, 2, 8, 5)
    shape = (blocks, block_size, heads, head_dim)
    key_cache = torch.randint(0, 256, shape, dtype=torch.uint8, device=device)
    value_cache = torch.randint(0, 256, shape, dtype=torch.uint8, device=device)
    perm = torch.randperm(blocks, device=device)
    dst = perm[:pairs]
    src = perm[pairs:][torch.randint(0, blocks - pairs, (pairs,), device=device)]
    block_mapping = torch.stack([src, dst], dim=1).to(torch.int64)
    return [key_cache, value_cache, block_mapping]


def reference(key_cache, value_cache, block_mapping):
    src, dst = block_mapping[:, 0], block_mapping[:, 1]
    new_key, new_value = key_cache.clone(), value_cache.clone()
    new_key[dst] = key_cache[src]
    new_value[dst] = value_cache[src]
    return new_key, new_value
