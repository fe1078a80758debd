"""Gather each request's tokens from a paged FP8 e4m3 MLA cache (bytes as uint8; request r's token i at block block_table[r, i // 16], offset i % 16) into one buffer, requests back to back, dequantized as float(code) * scale; return fp32 [tokens, 576]."""
# Source: DeepSeek-V3's MLA cache entry (kv_lora_rank 512 + qk_rope_head_dim 64 = 576 values per
# token, shared by all heads) stored as FP8 with one per-tensor scale, gathered into a dense buffer
# before the prefill attention over cached context, in the shape of the original MetaKernelBench
# p23, taken from vLLM's gather-and-maybe-dequant MLA cache test: 1,024 blocks x 16, 8 requests,
# 4,096 tokens, scale 0.1.
# Layout: src_cache uint8 [1024, 16, 576] (the raw bytes of float8_e4m3fn codes); block_table int32
# [8, 1024] (each row a permutation of all block ids; a request reads only its first
# ceil(len / 16) entries, so two requests may share blocks); seq_lens int32 [8] (output rows are the
# requests' tokens in order); scale a Python float. The dequantized values are computed in fp32.
# Workload: 8 requests, 4,096 tokens in all (lengths a random split, each >= 1). Fixed: shapes,
# total tokens, scale. Redrawn per draw: the cache (e4m3 of clamp(N(0, 1) / 0.1, +-448), drawn in
# fp16), the block table rows, the lengths.
# SOL bytes count the entries gathered (4,096 x 576 bytes), not the whole pool.
# DSL share (strict policy): the output's row count is the sum of seq_lens, which lives on the device, so
# every solution copies it to the host once per call before it can allocate the output; that copy is
# latency-bound (~1 us on the H200, measured 2026-12-03) against a gather of a few us, so a solution at
# speed of light would sit near 0.7. The floor is 0.6.
import torch

DTYPE = "fp8"
SOL = {
    "flops": 4096 * 576,
    "bytes": 4096 * 576 + 4 * 8 * 1024 + 4 * 8 + 4 * 4096 * 576,
}

DSL_SHARE = {"min": 0.6, "reason": "data-dependent row count: one device-to-host copy of the lengths per call"}

SCALE = 0.1


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        blocks, block_size, requests, tokens = 1024, 16, 8, 4096
    else:
        blocks, block_size, requests, tokens = 16, 4, 3, 20
    values = torch.randn(blocks, block_size, 576, device=device, dtype=torch.float16)
    src_cache = (values / SCALE).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)
    block_table = torch.stack([torch.randperm(blocks, device=device) for _ in range(requests)]).to(torch.int32)
    cuts = torch.randperm(tokens - 1, device=device)[:requests - 1].sort().values + 1
    bounds = torch.cat([cuts.new_zeros(1), cuts, cuts.new_full((1,), tokens)])
    seq_lens = bounds.diff().to(torch.int32)
    return [src_cache, block_table, seq_lens, SCALE]


def reference(src_cache, block_table, seq_lens, scale):
    block_size = src_cache.shape[1]
    lens = seq_lens.long()
    request = torch.repeat_interleave(torch.arange(lens.numel(), device=lens.device), lens)
    position = torch.arange(request.numel(), device=lens.device) - (lens.cumsum(0) - lens)[request]
    block = block_table.long()[request, position // block_size]
    codes = src_cache[block, position % block_size].view(torch.float8_e4m3fn)
    return codes.to(torch.float32) * scale
