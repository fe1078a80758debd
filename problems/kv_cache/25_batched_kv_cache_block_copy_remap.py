"""Paged KV-cache block copy between caches: for each row (src, dst) of block_mapping copy block src of src_k/src_v into block dst of dst_k/dst_v, in place (uint8 caches); returns None."""
# Source: the block swap of paged KV caches in vLLM (swap_blocks: whole cache blocks move between
# two caches, e.g. GPU <-> CPU swap space, under one source-to-destination block mapping); the
# workload is the original MetaKernelBench p25's, itself from vLLM's cache-kernel tests.
# Cache layout [num_blocks, block_size, num_kv_heads, head_dim] with fp8 entries kept as raw bytes
# (uint8). block_mapping int64 [pairs, 2]: column 0 the source block, column 1 the destination.
# In place (MUTATES): dst_k and dst_v are updated where the mapping points and nothing else changes;
# src_k and src_v are only read. The original also returns the two destination caches (the same
# tensors it updates); here they are graded in place and not returned again.
# Workload: 4 caches of 1,024 blocks x 32 tokens x 8 heads x 256 bytes (64 MiB each), 256 pairs.
# Sources and destinations come from one random permutation of the block ids (the first 256 are
# the sources, the next 256 the destinations), so all 512 are distinct and the copy order does not
# matter. Fixed: shapes, number of pairs. Redrawn per draw: the bytes of all four caches, the mapping.
import torch

DTYPE = "uint8"
EXACT = True
MUTATES = ("dst_k", "dst_v")
SOL = {"flops": 0, "bytes": 2 * 2 * 256 * 32 * 8 * 256 + 256 * 2 * 8}


def make_inputs(device="cuda", scale="full"):
    blocks, block_size, heads, head_dim, pairs = (1024, 32, 8, 256, 256) if scale == "full" else (16, 4, 2, 8, 5)
    shape = (blocks, block_size, heads, head_dim)
    caches = [torch.randint(0, 256, shape, dtype=torch.uint8, device=device) for _ in range(4)]
    order = torch.randperm(blocks, device=device)
    block_mapping = torch.stack([order[:pairs], order[pairs:2 * pairs]], dim=1)
    return [*caches, block_mapping]


def reference(src_k, src_v, dst_k, dst_v, block_mapping):
    src, dst = block_mapping[:, 0], block_mapping[:, 1]
    dst_k[dst] = src_k[src]
    dst_v[dst] = src_v[src]
    return None
