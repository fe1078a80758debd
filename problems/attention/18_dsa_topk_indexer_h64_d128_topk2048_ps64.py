"""DeepSeek lightning-indexer top-k (fp8): score[b, s] = sum_h weights[b, h] * relu(q[b, h] . k[s]) over the sequence's cached tokens s < seq_len (FP8 e4m3 q, paged packed FP8 key cache with one fp32 scale per token); return a 1-tuple of int32 [batch, 2048]: the cache slots (page * 64 + offset) of the 2,048 highest scores, in ascending position order (all tokens when seq_len <= 2048), padded with -1."""
# Source: DeepSeek-V3.2's lightning indexer (index_n_heads 64, index_head_dim 128, index_topk 2048:
# every cached token is scored for the query token with 64 index heads, one 128-d FP8 index key
# per token shared by all heads, the top 2,048 feed the sparse attention), in the shape of the
# original MetaKernelBench p18, a captured FlashInfer-Bench workload: 31 sequences with the lengths
# SEQ_LENS fixed below (one of them, 2,693, longer than 2,048), block tables 43 pages wide, a pool
# of 11,923 pages of 64 tokens.
# Packed key cache, as in the original: k_index_cache_fp8 int8 [11923, 64, 1, 132] holds, for each
# page, its 64 x 128 e4m3 codes (token-major) followed by 64 fp32 scales (little-endian bytes); the
# key of token o of a page is code[o, :] * scale[o].
# Layout: q_index_fp8 float8_e4m3fn [31, 64, 128]; weights fp32 [31, 64]; seq_lens int32 [31];
# block_table int32 [31, 43] (token s of sequence b is slot s % 64 of page block_table[b, s // 64];
# columns past a sequence's last page are 0; page 0 is never used). Scores are computed in fp32.
# The output lists global cache slots, ordered by the tokens' positions in the sequence (a canonical
# order: only the set is a decision, at the 2048th / 2049th boundary).
# Fixed: shapes, the lengths. Drawn once per draw: the block table (distinct random pages); then q
# (e4m3 of N(0, 1)), the cache (codes e4m3 of N(0, 1), scales uniform in 0.5..1.0) and weights
# N(0, 1), redrawn (at most 16 times, as in the original) until every sequence longer than 2,048
# has a gap >= MARGIN between its 2048th and 2049th scores.
# SOL bytes count the cache rows the sequences read, not the whole pool.
import torch

DTYPE = "fp8"
SOL = {
    "flops": 2 * 11934 * 64 * 128 + 3 * 11934 * 64,
    "bytes": 31 * 64 * 128 + 4 * 31 * 64 + 11934 * 132 + 4 * 31 + 4 * 31 * 43 + 4 * 31 * 2048,
}
EXACT = True
MARGIN = 1e-3

TOPK, PAGE_SIZE, DIM = 2048, 64, 128
NUM_PAGES, MAX_NUM_PAGES = 11923, 43
SEQ_LENS = (63, 9, 2693, 212, 11, 25, 6, 50, 77, 22, 25, 10, 52, 76, 11, 30, 1822, 25, 1034, 1811, 7, 13, 23, 1896,
            13, 285, 18, 166, 16, 1421, 12)
REDRAW_LIMIT = 16


def _block_table(seq_lens, pages, width, device):
    order = torch.randperm(pages - 1, device=device) + 1
    table = torch.zeros(len(seq_lens), width, dtype=torch.int32, device=device)
    start = 0
    for b, n in enumerate(seq_lens):
        count = -(-n // PAGE_SIZE)
        table[b, :count] = order[start:start + count].to(torch.int32)
        start += count
    return table


def _packed_cache(pages, device):
    codes = torch.randn(pages, PAGE_SIZE, DIM, device=device).to(torch.float8_e4m3fn)
    scales = torch.rand(pages, PAGE_SIZE, device=device) * 0.5 + 0.5
    packed = torch.cat([codes.view(torch.uint8).view(pages, -1), scales.view(torch.uint8).view(pages, -1)], dim=1)
    return packed.view(torch.int8).view(pages, PAGE_SIZE, 1, DIM + 4)


def _keys(k_index_cache_fp8, compute):
    """[pages, 64, 128] dequantized keys."""
    pages = k_index_cache_fp8.shape[0]
    raw = k_index_cache_fp8.view(torch.uint8).reshape(pages, -1)
    codes = raw[:, :PAGE_SIZE * DIM].contiguous().view(torch.float8_e4m3fn).view(pages, PAGE_SIZE, DIM)
    scales = raw[:, PAGE_SIZE * DIM:].contiguous().view(torch.float32).view(pages, PAGE_SIZE, 1)
    return codes.to(compute) * scales.to(compute)


def _scores(q_index_fp8, keys, weights, seq_lens, block_table):
    """Per sequence: (its pages, its [seq_len] scores in the keys' precision)."""
    for b, n in enumerate(seq_lens.tolist()):
        pages = block_table[b, :-(-n // PAGE_SIZE)].long()
        k = keys[pages].reshape(-1, DIM)[:n]
        per_head = torch.relu(q_index_fp8[b].to(keys.dtype) @ k.T)
        yield pages, (per_head * weights[b].to(keys.dtype)[:, None]).sum(dim=0)


def decision_margin(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table):
    gaps = [float("inf")]
    keys = _keys(k_index_cache_fp8, torch.float64)
    for _, scores in _scores(q_index_fp8, keys, weights, seq_lens, block_table):
        if scores.numel() > TOPK:
            top = torch.topk(scores, TOPK + 1).values
            gaps.append(float(top[TOPK - 1] - top[TOPK]))
    return min(gaps)


def make_inputs(device="cuda", scale="full"):
    seq_lens, pages, width, heads = ((SEQ_LENS, NUM_PAGES, MAX_NUM_PAGES, 64) if scale == "full"
                                     else ((5, 2100, 70), 40, 34, 4))
    block_table = _block_table(seq_lens, pages, width, device)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    for _ in range(REDRAW_LIMIT):
        q_index_fp8 = torch.randn(len(seq_lens), heads, DIM, device=device).to(torch.float8_e4m3fn)
        k_index_cache_fp8 = _packed_cache(pages, device)
        weights = torch.randn(len(seq_lens), heads, device=device)
        inputs = [q_index_fp8, k_index_cache_fp8, weights, lens, block_table]
        if device == "meta" or decision_margin(*inputs) >= MARGIN:
            return inputs
    raise RuntimeError(f"selection margins under {MARGIN} after {REDRAW_LIMIT} redraws")


def reference(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table):
    keys = _keys(k_index_cache_fp8, torch.promote_types(weights.dtype, torch.float32))
    out = torch.full((seq_lens.numel(), TOPK), -1, dtype=torch.int32, device=seq_lens.device)
    for b, (pages, scores) in enumerate(_scores(q_index_fp8, keys, weights, seq_lens, block_table)):
        chosen = torch.topk(scores, min(TOPK, scores.numel())).indices.sort().values
        out[b, :chosen.numel()] = (pages[chosen // PAGE_SIZE] * PAGE_SIZE + chosen % PAGE_SIZE).to(torch.int32)
    return (out,)
