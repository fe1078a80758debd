"""Apply staged block-table writes in place for 3 hybrid KV-cache groups (manager blocks 16/32/8 expanded to kernel blocks 16/16/8; append at num_blocks or overwrite from 0, in write order), then compute each group's int64 slot mapping of the scheduled tokens (-1 past the last); return slot_mappings [3, 4096]."""
# Source: vLLM's hybrid KV-cache block tables (one table per KV-cache group; a group's allocator
# works in blocks of B tokens while its attention kernel reads blocks of K tokens, so manager block
# m becomes kernel blocks m * (B / K) + t, t < B / K), in the shape of the original MetaKernelBench
# p26, taken from vLLM's test of BlockTables applying staged writes for fused KV groups:
# (B, K) = (16, 16), (32, 16), (8, 8); 64 requests; 4,096 batched tokens; 128 staged writes.
# Staged writes, group by group and in write order w = 0..127: request r = write_requests[w],
# n = staged_counts[g, w] manager ids staged_ids[g, w, :n]; the write starts at column 0 when
# overwrite[w], else at num_blocks[g, r]; it stores the n * (B / K) kernel block ids there and sets
# num_blocks[g, r] to the end of what it wrote. A request gets two writes, so order matters.
# Slot mapping: batch row b owns tokens query_start_loc[b] .. query_start_loc[b + 1] - 1 and reads
# request idx_mapping[b]; token i with position p gets table_g[request, p // K] * K + p % K (read
# after the writes) in group g; tokens from query_start_loc[64] on get -1.
# Layout: block_table_0/1/2 int32 [64, 512], [64, 1024], [64, 512]; num_blocks int32 [3, 64];
# write_requests int32 [128]; overwrite bool [128]; staged_ids int32 [3, 128, 4] (-1 past the
# count); staged_counts int32 [3, 128] (0..4); idx_mapping int32 [64]; query_start_loc int32 [65];
# positions int64 [4096]. The three tables and num_blocks are updated in place (MUTATES); the
# original also returns them (the same tensors); here they are graded in place.
# Workload: fixed shapes as above. Redrawn per draw: prior tables (ids uniform in 0..2,047),
# num_blocks (all 0, as in the original), write order (two permutations of the 64 requests),
# overwrite flags, counts and ids, the batch order, per-request token counts (0..64), positions
# (0..63).
import torch

DTYPE = "int32/int64"
EXACT = True
MUTATES = ("block_table_0", "block_table_1", "block_table_2", "num_blocks")
SOL = {
    "flops": 3 * 4096 * 4,
    "bytes": 4 * 3 * 2 * 128 * 8 + 2 * 4 * 3 * 64 + 4 * 128 + 128 + 4 * 3 * 128 * 4 + 4 * 3 * 128 + 4 * 64
    + 4 * 65 + 8 * 4096 + 4 * 3 * 4096 + 8 * 3 * 4096,
}

BLOCK_SIZES = (16, 32, 8)
KERNEL_BLOCK_SIZES = (16, 16, 8)
STAGE_CAPACITY = 4
MAX_BLOCK_ID = 2048


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        requests, tokens, widths = 64, 4096, (512, 1024, 512)
    else:
        requests, tokens, widths = 4, 24, (16, 32, 16)
    i32 = torch.int32
    writes = 2 * requests
    tables = [torch.randint(0, MAX_BLOCK_ID, (requests, w), device=device, dtype=i32) for w in widths]
    num_blocks = torch.zeros(3, requests, device=device, dtype=i32)
    write_requests = torch.cat([torch.randperm(requests, device=device), torch.randperm(requests, device=device)])
    overwrite = torch.randint(0, 2, (writes,), device=device).bool()
    staged_counts = torch.randint(0, STAGE_CAPACITY + 1, (3, writes), device=device, dtype=i32)
    ids = torch.randint(0, MAX_BLOCK_ID, (3, writes, STAGE_CAPACITY), device=device, dtype=i32)
    used = torch.arange(STAGE_CAPACITY, device=device) < staged_counts[..., None]
    staged_ids = torch.where(used, ids, torch.full_like(ids, -1))
    idx_mapping = torch.randperm(requests, device=device).to(i32)
    lengths = torch.randint(0, tokens // requests + 1, (requests,), device=device)
    query_start_loc = torch.cat([lengths.new_zeros(1), lengths.cumsum(0).clamp(max=tokens)]).to(i32)
    max_position = 2 * STAGE_CAPACITY * min(BLOCK_SIZES)
    positions = torch.randint(0, max_position, (tokens,), device=device)
    return [*tables, num_blocks, write_requests.to(i32), overwrite, staged_ids, staged_counts, idx_mapping,
            query_start_loc, positions]


def reference(block_table_0, block_table_1, block_table_2, num_blocks, write_requests, overwrite, staged_ids,
              staged_counts, idx_mapping, query_start_loc, positions):
    tables = (block_table_0, block_table_1, block_table_2)
    requests_of, overwrites = write_requests.tolist(), overwrite.tolist()
    for g, table in enumerate(tables):
        ratio = BLOCK_SIZES[g] // KERNEL_BLOCK_SIZES[g]
        counts = staged_counts[g].tolist()
        for w, r in enumerate(requests_of):
            start = 0 if overwrites[w] else int(num_blocks[g, r])
            manager = staged_ids[g, w, :counts[w]].long()
            kernel_ids = (manager[:, None] * ratio + torch.arange(ratio, device=manager.device)).reshape(-1)
            table[r, start:start + kernel_ids.numel()] = kernel_ids.to(table.dtype)
            num_blocks[g, r] = start + kernel_ids.numel()
    bounds = query_start_loc.long()
    token = torch.arange(positions.numel(), device=positions.device)
    row = torch.searchsorted(bounds[1:], token, right=True).clamp(max=bounds.numel() - 2)
    request = idx_mapping.long()[row]
    scheduled = token < bounds[-1]
    slot_mappings = []
    for g, table in enumerate(tables):
        kernel_block = KERNEL_BLOCK_SIZES[g]
        block = table.long()[request, positions // kernel_block]
        slot = block * kernel_block + positions % kernel_block
        slot_mappings.append(torch.where(scheduled, slot, torch.full_like(slot, -1)))
    return torch.stack(slot_mappings)
