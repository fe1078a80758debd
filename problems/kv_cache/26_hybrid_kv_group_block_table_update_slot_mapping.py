"""Apply staged block-table appends for 3 hybrid KV-cache groups (manager blocks 16/32/8 split into kernel blocks 16/16/8), then compute each group's int64 slot mapping for the scheduled tokens (-1 for padding); return the 3 updated int32 block tables and the [3, tokens] slot mapping."""
# Source: hybrid-attention serving (e.g. a model mixing full-attention, sliding-window and other
# layer types, as in vLLM's hybrid KV-cache manager): every KV-cache group keeps its own block
# table per request. A group's allocator ("manager") works in blocks of B tokens while its
# attention kernel reads blocks of K tokens (B a multiple of K), so manager block m is stored in the
# kernel-unit table as the B/K kernel blocks m*(B/K) + t, t < B/K. Groups here: (B, K) = (16, 16),
# (32, 16), (8, 8).
# Staged writes (one scheduling step): write w appends manager blocks
# new_block_ids[write_cu[w]:write_cu[w+1]] to request write_req[w] of group write_group[w], the
# first at manager column write_start[w]; in the kernel-unit table that is
# table[req, (write_start + j) * (B/K) + t] = new_block_ids[write_cu + j] * (B/K) + t. Writes never
# overlap, so their order does not matter. Entries not written keep their old value.
# Slot mapping: scheduled token i < query_start_loc[-1] belongs to request r with
# query_start_loc[r] <= i < query_start_loc[r+1]; with p = positions[i] its slot in group g is
# table_g[r, p // K] * K + p % K (read after the writes). Tokens from query_start_loc[-1] on are
# padding: slot -1.
# Layout: tables int32 [64, 512], [64, 512], [64, 1024] (max model length 8,192 tokens);
# write_group, write_req, write_start int32 [128]; write_cu int32 [129]; new_block_ids int32;
# query_start_loc int32 [65]; positions int64 [4,096].
# Workload: 64 requests, 128 staged writes (distinct (group, request) pairs, each appending the
# blocks its request's new tokens need, plus 0-1 blocks of lookahead), 4,096 token slots of which
# the last 1..64 (redrawn) are padding. Fixed: shapes, block sizes. Redrawn per draw: the prior
# tables (valid block ids from pools of 16,384 manager blocks per group), each request's computed
# length and number of new tokens, which pairs get a write, and the new block ids.
import torch

DTYPE = "int32/int64"
SOL = {
    "flops": 3 * 4096 * 4,
    "bytes": 2 * 4 * 64 * (512 + 512 + 1024) + 3 * 4 * 128 + 4 * 129 + 4 * 1024 + 4 * 65 + 8 * 4096
    + 8 * 3 * 4096,
}
EXACT = True

BLOCK_SIZES = (16, 32, 8)
KERNEL_BLOCK_SIZES = (16, 16, 8)
POOL_BLOCKS = 16384


def _split(total, parts, device):
    """Random lengths >= 1 that sum to total."""
    cuts = torch.randperm(total - 1, device=device)[: parts - 1] + 1
    bounds = torch.cat([torch.zeros(1, dtype=torch.int64, device=device), cuts.sort().values,
                        torch.full((1,), total, dtype=torch.int64, device=device)])
    return bounds.diff()


def _prior_table(requests, max_len, block, kernel_block, device):
    ratio = block // kernel_block
    manager = torch.randint(0, POOL_BLOCKS, (requests, max_len // block), device=device)
    kernel = manager[:, :, None] * ratio + torch.arange(ratio, device=device)
    return kernel.reshape(requests, -1).to(torch.int32)


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        requests, writes, tokens, max_len, max_pad = 64, 128, 4096, 8192, 64
    else:
        requests, writes, tokens, max_len, max_pad = 4, 7, 24, 128, 3
    tables = [_prior_table(requests, max_len, b, k, device) for b, k in zip(BLOCK_SIZES, KERNEL_BLOCK_SIZES)]
    pad = int(torch.randint(1, max_pad + 1, (1,)).item())
    new_tokens = _split(tokens - pad, requests, device)
    room = max_len - max(BLOCK_SIZES) - new_tokens
    computed = (torch.rand(requests, device=device) * (room + 1).to(torch.float32)).long().clamp(max=room)
    query_start_loc = torch.cat([torch.zeros(1, dtype=torch.int64, device=device), new_tokens.cumsum(0)])
    request_of = torch.repeat_interleave(torch.arange(requests, device=device), new_tokens)
    offset = torch.arange(tokens - pad, device=device) - query_start_loc[request_of]
    positions = torch.zeros(tokens, dtype=torch.int64, device=device)
    positions[: tokens - pad] = computed[request_of] + offset
    pairs = torch.randperm(3 * requests, device=device)[:writes]
    write_group, write_req = pairs // requests, pairs % requests
    block = torch.tensor(BLOCK_SIZES, device=device)[write_group]
    held = (computed[write_req] + block - 1) // block
    needed = (computed[write_req] + new_tokens[write_req] + block - 1) // block
    count = needed - held + torch.randint(0, 2, (writes,), device=device)
    count = count.clamp(min=1)
    write_cu = torch.cat([torch.zeros(1, dtype=torch.int64, device=device), count.cumsum(0)])
    new_block_ids = torch.randint(0, POOL_BLOCKS, (int(write_cu[-1]),), device=device)
    i32 = torch.int32
    return [tables[0], tables[1], tables[2], write_group.to(i32), write_req.to(i32), held.to(i32),
            write_cu.to(i32), new_block_ids.to(i32), query_start_loc.to(i32), positions]


def reference(table_0, table_1, table_2, write_group, write_req, write_start, write_cu, new_block_ids,
              query_start_loc, positions):
    device = positions.device
    tables = [table_0.clone(), table_1.clone(), table_2.clone()]
    cu = write_cu.long()
    counts = cu[1:] - cu[:-1]
    write_of = torch.repeat_interleave(torch.arange(counts.numel(), device=device), counts,
                                       output_size=new_block_ids.numel())
    column = write_start.long()[write_of] + torch.arange(new_block_ids.numel(), device=device) - cu[write_of]
    group_of = write_group.long()[write_of]
    request_of = write_req.long()[write_of]
    ids = new_block_ids.long()
    slots = []
    for g, (block, kernel_block) in enumerate(zip(BLOCK_SIZES, KERNEL_BLOCK_SIZES)):
        ratio = block // kernel_block
        sel = group_of == g
        sub = torch.arange(ratio, device=device)
        rows = request_of[sel][:, None].expand(-1, ratio)
        cols = column[sel][:, None] * ratio + sub
        tables[g][rows, cols] = (ids[sel][:, None] * ratio + sub).to(tables[g].dtype)
    qsl = query_start_loc.long()
    token = torch.arange(positions.numel(), device=device)
    request = torch.searchsorted(qsl[1:], token, right=True).clamp(max=qsl.numel() - 2)
    valid = token < qsl[-1]
    for g, kernel_block in enumerate(KERNEL_BLOCK_SIZES):
        block_id = tables[g][request, positions // kernel_block].long()
        slot = block_id * kernel_block + positions % kernel_block
        slots.append(torch.where(valid, slot, torch.full_like(slot, -1)))
    return tables[0], tables[1], tables[2], torch.stack(slots)
