"""Gather every request's cached tokens from a paged FP8 MLA cache of packed 656-byte entries (512 e4m3 codes, 4 fp32 group scales, 64 bf16 rope values) into one bf16 buffer, requests back to back: [bf16(e4m3[j] * scale[j // 128]) for j < 512 | rope 64]; return bf16 [tokens, 576]."""
# Source: DeepSeek-V3.2's FP8 sparse-MLA cache entry (kv_lora_rank 512 stored as float8_e4m3fn
# with one fp32 scale per group of 128, then the 64-d rope key kept in bf16: 656 bytes per token),
# gathered and up-converted to bf16 before the prefill attention over cached context that
# context-parallel ranks share, in the shape of the original MetaKernelBench p24, taken from
# vLLM's cp_gather_and_upconvert_fp8_kv_cache test: 16 blocks x 64 slots, 3 requests, 641 tokens.
# Layout: cache uint8 [16, 64, 656] (bytes little-endian: codes 0..511, scales 512..527, rope
# 528..655); block_table int32 [3, 10] (request r's token i lives in block block_table[r, i // 64]
# at offset i % 64; columns past a request's last block are 0 and never read); seq_lens int32 [3].
# Each group's product is computed in fp32 and rounded to bf16; the rope bytes are copied as bf16.
# Change from the original: its block table is exactly as wide as the longest request needs (4..10
# columns, varying per draw); here it is always 10 columns (the most any split of 641 tokens into 3
# requests needs), so every draw has the same input shapes, which the judge's timing pool requires.
# Workload: 3 requests, 641 tokens in all (lengths a random split, each >= 1). Fixed: shapes, total
# tokens. Redrawn per draw: codes (e4m3 of N(0, 1)), scales uniform in 0.1..2.1, rope N(0, 1), the
# lengths, the blocks (distinct, random among the 16).
# SOL bytes count the entries gathered, not the whole pool.
import torch

DTYPE = "bf16"
SOL = {
    "flops": 641 * 512,
    "bytes": 641 * 656 + 4 * 3 * 10 + 4 * 3 + 2 * 641 * 576,
}

NOPE, ROPE, GROUP = 512, 64, 128
SCALES_AT, ROPE_AT, ENTRY = 512, 528, 656


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        blocks, block_size, requests, tokens, width = 16, 64, 3, 641, 10
    else:
        blocks, block_size, requests, tokens, width = 8, 4, 2, 9, 3
    slots = blocks * block_size
    codes = torch.randn(slots, NOPE, device=device).to(torch.float8_e4m3fn)
    scales = torch.rand(slots, NOPE // GROUP, device=device) * 2.0 + 0.1
    rope = torch.randn(slots, ROPE, device=device, dtype=torch.bfloat16)
    cache = torch.cat([codes.view(torch.uint8), scales.view(torch.uint8), rope.view(torch.uint8)], dim=-1)
    cuts = torch.randperm(tokens - 1, device=device)[:requests - 1].sort().values + 1
    bounds = torch.cat([cuts.new_zeros(1), cuts, cuts.new_full((1,), tokens)])
    lengths = bounds.diff()
    needed = ((lengths + block_size - 1) // block_size).tolist()
    order = torch.randperm(blocks, device=device).to(torch.int32)
    block_table = torch.zeros(requests, width, dtype=torch.int32, device=device)
    start = 0
    for r, n in enumerate(needed):
        block_table[r, :n] = order[start:start + n]
        start += n
    return [cache.view(blocks, block_size, ENTRY), block_table, lengths.to(torch.int32)]


def reference(cache, block_table, seq_lens):
    block_size = cache.shape[1]
    lens = seq_lens.long()
    request = torch.repeat_interleave(torch.arange(lens.numel(), device=lens.device), lens)
    position = torch.arange(request.numel(), device=lens.device) - (lens.cumsum(0) - lens)[request]
    entries = cache[block_table.long()[request, position // block_size], position % block_size]
    codes = entries[:, :NOPE].contiguous().view(torch.float8_e4m3fn).to(torch.float32)
    scales = entries[:, SCALES_AT:ROPE_AT].contiguous().view(torch.float32)
    nope = (codes.view(-1, NOPE // GROUP, GROUP) * scales[..., None]).to(torch.bfloat16).view(-1, NOPE)
    rope = entries[:, ROPE_AT:].contiguous().view(torch.bfloat16)
    return torch.cat([nope, rope], dim=-1)
