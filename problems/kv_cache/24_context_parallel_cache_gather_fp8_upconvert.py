"""Gather every request's cached tokens from a paged FP8 MLA cache of packed 656-byte entries (512 e4m3 values, 4 fp32 group scales, 64 bf16 rope values) into the bf16 workspace at workspace_starts, dequantizing value j as e4m3[j] * scale[j // 128]; return the filled workspace [tokens, 576]."""
# Source: DeepSeek-V3.2 (kv_lora_rank 512, qk_rope_head_dim 64) with its FP8 sparse-MLA cache
# format: each token's entry is 656 bytes = 512 float8_e4m3fn codes of the compressed kv, then 4
# fp32 scales (one per group of 128 codes), then the 64-d rope key kept in bf16 (128 bytes).
# Before the prefill attention over cached context (computed across context-parallel ranks) the
# cached tokens of each request are gathered into a dense bf16 workspace: request r's token i lives
# in block block_table[r, i // 64] at offset i % 64 and goes to workspace row workspace_starts[r] + i,
# as [e4m3[0:512] * group scale (computed in fp32, rounded to bf16) | rope 64].
# Layout: kv_cache uint8 [16 blocks, 64, 656] (bytes little-endian); block_table int32 [3, 16]
# (entries past a request's last block are 0); seq_lens int32 [3]; workspace_starts int32 [3]
# (exclusive prefix sum of seq_lens); workspace bf16 [tokens, 576]: every row is overwritten, it
# only carries the output dtype (the caller's buffer), so a kernel need not read it.
# Workload: 3 requests, 641 tokens in all (lengths a random split, each >= 1). Fixed: shapes,
# total tokens. Redrawn per draw: the cache (codes = e4m3 of x / scale with scale = group absmax
# / 448, x ~ N(0, 1) times a per-token magnitude; rope N(0, 1)), lengths, blocks (distinct, random
# among 16), workspace contents.
# SOL bytes count the entries gathered, not the whole pool, and no read of the workspace.
import torch

DTYPE = "bf16"
SOL = {
    "flops": 641 * 512,
    "bytes": 641 * 656 + 4 * 3 * 16 + 4 * 3 + 4 * 3 + 2 * 641 * 576,
}

NOPE, ROPE, GROUP = 512, 64, 128
ENTRY = NOPE + 4 * (NOPE // GROUP) + 2 * ROPE  # 656 bytes


def _split(total, parts, device):
    """Random lengths >= 1 that sum to total."""
    cuts = torch.randperm(total - 1, device=device)[: parts - 1] + 1
    bounds = torch.cat([torch.zeros(1, dtype=torch.int64, device=device), cuts.sort().values,
                        torch.full((1,), total, dtype=torch.int64, device=device)])
    return bounds.diff()


def _pack_entries(n, device):
    x = torch.randn(n, NOPE, device=device) * torch.exp(0.5 * torch.randn(n, 1, device=device))
    groups = x.view(n, NOPE // GROUP, GROUP)
    scales = groups.abs().amax(dim=-1) / 448.0
    codes = (groups / scales[..., None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(n, NOPE)
    rope = torch.randn(n, ROPE, device=device).to(torch.bfloat16)
    return torch.cat([codes.view(torch.uint8), scales.view(torch.uint8), rope.view(torch.uint8)], dim=-1)


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        blocks, block_size, requests, tokens = 16, 64, 3, 641
    else:
        blocks, block_size, requests, tokens = 6, 4, 2, 9
    kv_cache = _pack_entries(blocks * block_size, device).view(blocks, block_size, ENTRY)
    seq_lens = _split(tokens, requests, device)
    needed = (seq_lens + block_size - 1) // block_size
    pool = torch.randperm(blocks, device=device)
    block_table = torch.zeros(requests, blocks, dtype=torch.int32, device=device)
    start = 0
    for r, n in enumerate(needed.tolist()):
        block_table[r, :n] = pool[start:start + n].to(torch.int32)
        start += n
    workspace_starts = (seq_lens.cumsum(0) - seq_lens).to(torch.int32)
    workspace = torch.randn(tokens, NOPE + ROPE, device=device).to(torch.bfloat16)
    return [kv_cache, block_table, seq_lens.to(torch.int32), workspace_starts, workspace]


def reference(kv_cache, block_table, seq_lens, workspace_starts, workspace):
    compute = torch.promote_types(workspace.dtype, torch.float32)
    blocks, block_size, _ = kv_cache.shape
    device = kv_cache.device
    lens = seq_lens.long()
    request = torch.repeat_interleave(torch.arange(lens.numel(), device=device), lens)
    position = torch.arange(request.numel(), device=device) - (lens.cumsum(0) - lens)[request]
    block = block_table.long()[request, position // block_size]
    entries = kv_cache[block, position % block_size]  # [tokens, 656] bytes
    codes = entries[:, :NOPE].view(torch.float8_e4m3fn).to(compute)
    scales = entries[:, NOPE:NOPE + 4 * (NOPE // GROUP)].view(torch.float32).to(compute)
    rope = entries[:, NOPE + 4 * (NOPE // GROUP):].view(torch.bfloat16).to(compute)
    nope = (codes.view(-1, NOPE // GROUP, GROUP) * scales[..., None]).view(-1, NOPE)
    out = workspace.clone()
    out[workspace_starts.long()[request] + position] = torch.cat([nope, rope], dim=-1).to(workspace.dtype)
    return out
