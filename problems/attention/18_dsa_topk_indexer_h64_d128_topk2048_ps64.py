"""DeepSeek lightning-indexer decode top-k (fp8): score[b, s] = sum_h weights[b, h] * relu(q[b, h] . k[s] * k_scale[s]) over the sequence's cached tokens s < seq_len (FP8 e4m3 q, paged packed FP8 key cache with one fp32 scale per token); return int32 [batch, 2048]: the positions of the 2,048 highest scores in ascending order (all positions when seq_len <= 2048), padded with -1."""
# Source: DeepSeek-V3.2-Exp config.json: index_n_heads 64, index_head_dim 128, index_topk 2048.
# The lightning indexer scores every cached token for the current query token with 64 index heads,
# I(t, s) = sum_h w[t, h] * ReLU(q[t, h] . k[s]), one 128-d index key per token shared by all heads;
# the top-2048 tokens feed the sparse attention. q is FP8 e4m3 (its per-(token, head) dequant scale
# and the softmax scale are folded into w, fp32); keys are FP8 e4m3 with one fp32 scale per token,
# stored paged (64 tokens per block) in the packed layout: block row = [64 x 128 e4m3 codes | 64 fp32
# scales] (8,448 bytes, little-endian).
# Layout: q float8_e4m3fn [batch, 64, 128]; weights fp32 [batch, 64]; k_cache uint8 [2,048 blocks,
# 8,448]; seq_lens int32 [batch]; block_table int32 [batch, 43] (token s of sequence b is slot s % 64
# of block block_table[b, s // 64]; entries past the last block are 0). Decode: one query token per
# sequence, at position seq_len - 1, which sees all seq_len cached tokens.
# Output order is ascending position (a canonical order that depends only on the selected set, so
# only the 2048th/2049th boundary is a decision); unused entries are -1.
# Workload: 31 sequences, lengths uniform in 1..2,693 (the longest is 2,693). Fixed: shapes.
# Redrawn per draw: q (e4m3 of N(0, 1)), weights N(0, 1) / sqrt(64 * 128), keys (e4m3 codes of
# N(0, 1) * per-token magnitude, scale = absmax / 448), lengths, blocks (distinct, random). For
# sequences longer than 2,048 the gap between the 2048th and 2049th score is kept >= MARGIN times the
# standard deviation of that sequence's scores by redrawing that sequence's q and weights (fp32
# rounding of a score is ~1e-6 of that spread).
import torch

DTYPE = "fp8"
SOL = {
    "flops": 2 * 31 * 1347 * 64 * 128 + 3 * 31 * 1347 * 64,
    "bytes": 31 * 64 * 128 + 4 * 31 * 64 + 31 * 1347 * 132 + 4 * 31 + 4 * 31 * 43 + 4 * 31 * 2048,
}
EXACT = True
MARGIN = 1e-3

HEADS, DIM, TOPK = 64, 128, 2048


def _scores(q, weights, k_cache, seq_lens, block_table, block_size):
    """[batch, max_len] index scores in the weights' precision (-inf past each sequence's length)."""
    compute = torch.promote_types(weights.dtype, torch.float32)
    blocks = k_cache.shape[0]
    batch, width = block_table.shape
    codes = k_cache[:, : block_size * DIM]
    scales = k_cache[:, block_size * DIM:].view(torch.float32)                      # [blocks, 64]
    table = block_table.long()
    keys = codes[table].view(torch.float8_e4m3fn).view(batch, width * block_size, DIM).to(compute)
    keys = keys * scales[table].view(batch, width * block_size, 1).to(compute)
    logits = torch.einsum("bhd,bsd->bhs", q.to(compute), keys)
    score = (torch.relu(logits) * weights.to(compute)[:, :, None]).sum(dim=1)
    valid = torch.arange(width * block_size, device=q.device)[None, :] < seq_lens.long()[:, None]
    return score.masked_fill(~valid, float("-inf")), valid


def _boundary_gap(score):
    """Per row: (2048th - 2049th score) / std of the row's scores; +inf for rows of <= 2048 tokens."""
    finite = torch.isfinite(score)
    count = finite.sum(dim=-1)
    top = score.topk(TOPK + 1, dim=-1).values
    values = score.masked_fill(~finite, 0.0)
    mean = values.sum(dim=-1) / count
    var = ((values - mean[:, None]) * finite).pow(2).sum(dim=-1) / (count - 1).clamp_min(1)
    gap = (top[:, TOPK - 1] - top[:, TOPK]) / var.sqrt().clamp_min(1e-30)
    return torch.where(count > TOPK, gap, torch.full_like(gap, float("inf")))


def _pack_keys(blocks, block_size, device):
    magnitude = torch.exp(0.5 * torch.randn(blocks, block_size, 1, device=device))
    k = torch.randn(blocks, block_size, DIM, device=device) * magnitude
    scales = k.abs().amax(dim=-1) / 448.0
    codes = (k / scales[..., None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return torch.cat([codes.view(torch.uint8).view(blocks, -1), scales.view(torch.uint8)], dim=-1)


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        batch, blocks, block_size, max_len = 31, 2048, 64, 2693
    else:
        batch, blocks, block_size, max_len = 3, 112, 64, 2100
    width = (max_len + block_size - 1) // block_size
    k_cache = _pack_keys(blocks, block_size, device)
    seq_lens = torch.randint(1, max_len + 1, (batch,), device=device)
    seq_lens[torch.randint(0, batch, (1,), device=device)] = max_len
    needed = (seq_lens + block_size - 1) // block_size
    pool = torch.randperm(blocks, device=device)
    block_table = torch.zeros(batch, width, dtype=torch.int32, device=device)
    start = 0
    for b, n in enumerate(needed.tolist()):
        block_table[b, :n] = pool[start:start + n].to(torch.int32)
        start += n
    seq_lens = seq_lens.to(torch.int32)
    q = torch.randn(batch, HEADS, DIM, device=device).to(torch.float8_e4m3fn)
    weights = torch.randn(batch, HEADS, device=device) / (HEADS * DIM) ** 0.5
    pending = seq_lens > TOPK
    for _ in range(1000):
        rows = pending.nonzero().squeeze(-1)
        if rows.numel() == 0:
            return [q, weights, k_cache, seq_lens, block_table]
        score, _ = _scores(q[rows], weights[rows].double(), k_cache, seq_lens[rows], block_table[rows], block_size)
        redo = rows[_boundary_gap(score) < MARGIN]
        pending = torch.zeros_like(pending)
        pending[redo] = True
        fresh = torch.randn(redo.numel(), HEADS, DIM, device=device).to(torch.float8_e4m3fn)
        q.view(torch.uint8)[redo] = fresh.view(torch.uint8)
        weights[redo] = torch.randn(redo.numel(), HEADS, device=device) / (HEADS * DIM) ** 0.5
    raise RuntimeError("could not draw inputs with a clear top-k boundary")


def decision_margin(q, weights, k_cache, seq_lens, block_table):
    block_size = k_cache.shape[1] // (DIM + 4)
    score, _ = _scores(q, weights.double(), k_cache, seq_lens, block_table, block_size)
    return float(_boundary_gap(score).min().clamp(max=1.0))


def reference(q, weights, k_cache, seq_lens, block_table):
    block_size = k_cache.shape[1] // (DIM + 4)
    score, valid = _scores(q, weights, k_cache, seq_lens, block_table, block_size)
    chosen = score.topk(TOPK, dim=-1).indices
    keep = valid.gather(1, chosen)
    positions = torch.where(keep, chosen, torch.full_like(chosen, score.shape[1]))
    positions = positions.sort(dim=-1).values
    return torch.where(positions < score.shape[1], positions, torch.full_like(positions, -1)).to(torch.int32)
