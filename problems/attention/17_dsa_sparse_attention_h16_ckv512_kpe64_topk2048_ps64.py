"""DeepSeek sparse MLA attention (bf16): each query token attends only to its selected cache slots sparse_indices[t] (global slots page * 64 + offset into the paged ckv/kpe caches, -1 = unused), logits = (q_nope.ckv + q_pe.kpe) * sm_scale, out = softmax @ ckv; return out [tokens, 16, 512] (bf16) and the base-2 LSE (fp32)."""
# Source: DeepSeek-V3.2 at tensor parallel 8 (16 heads per GPU; kv_lora_rank 512, qk_rope_head_dim
# 64, index_topk 2048): DeepSeek Sparse Attention, the absorbed MLA restricted to the 2,048 (or
# fewer) cached tokens the indexer picked for each query. Shape of the original MetaKernelBench p17,
# a captured FlashInfer-Bench workload: 62 query tokens whose selection counts SELECT_LENS are fixed
# below (11,837 selected slots in all); token LONG_ROW selects 2,048 of a 2,161-token context in the
# captured pattern LONG_ROW_RUNS ((start, length) runs of logical positions), every other token
# selects all of its context (positions 0..len-1); a pool of 6,465 pages of 64 slots; sm_scale
# 0.1352337788608801 (YaRN mscale^2 / sqrt(192)) passed as a Python float.
# Selection per draw, as in the original: each token's context gets its own distinct random pages
# from the pool (ceil(context / 64) of them, 225 in all); a logical position p maps to slot
# page[p // 64] * 64 + p % 64; a row lists its slots in ascending order, then -1.
# Layout: q_nope [62, 16, 512], q_pe [62, 16, 64]; ckv_cache [6465, 64, 512], kpe_cache
# [6465, 64, 64]; sparse_indices int32 [62, 2048]. lse[t, h] = log2(sum over selected j of
# exp(logit)).
# Fixed: shapes, counts, the long row's pattern, sm_scale. Redrawn per draw: q_nope, q_pe, both
# caches ~ N(0, 1), the pages of every token's context.
# SOL bytes count the 11,837 selected entries, not the whole pool.
import math

import torch

DTYPE = "bf16"
SOL = {
    "flops": 2 * 16 * (512 + 64 + 512) * 11837,
    "bytes": 2 * 62 * 16 * 576 + 2 * 11837 * 576 + 4 * 62 * 2048 + 2 * 62 * 16 * 512 + 4 * 62 * 16,
}

NUM_PAGES, PAGE_SIZE, TOPK = 6465, 64, 2048
SM_SCALE = 0.1352337788608801
SELECT_LENS = (18, 11, 2048, 20, 25, 45, 135, 7, 8, 10, 22, 17, 11, 30, 130, 9, 600, 255, 1033, 1010, 58, 2, 21, 954,
               7, 14, 1015, 28, 64, 5, 18, 33, 26, 86, 5, 14, 10, 90, 53, 22, 2, 17, 154, 51, 121, 25, 16, 5, 19, 12,
               44, 124, 33, 1157, 9, 5, 1319, 300, 23, 35, 389, 8)
LONG_ROW, LONG_ROW_CONTEXT = 2, 2161
LONG_ROW_RUNS = ((0, 53), (54, 10), (65, 25), (91, 11), (103, 42), (146, 12), (159, 65), (225, 7), (233, 3),
                 (237, 40), (278, 1), (280, 12), (293, 13), (307, 8), (316, 1), (318, 5), (324, 4), (329, 3),
                 (333, 3), (337, 21), (359, 14), (374, 1), (377, 1), (379, 24), (404, 110), (515, 13), (529, 20),
                 (550, 6), (557, 41), (599, 16), (616, 14), (631, 15), (647, 10), (658, 6), (665, 24), (691, 11),
                 (703, 15), (719, 10), (730, 21), (752, 21), (774, 26), (801, 28), (830, 7), (838, 11), (850, 1),
                 (852, 12), (865, 18), (884, 5), (890, 1), (892, 1), (894, 9), (904, 11), (916, 10), (927, 12),
                 (940, 4), (946, 23), (970, 7), (978, 6), (985, 29), (1015, 5), (1021, 22), (1045, 13), (1059, 37),
                 (1097, 10), (1108, 42), (1151, 1), (1153, 30), (1184, 2), (1187, 31), (1219, 33), (1253, 8),
                 (1262, 102), (1366, 54), (1421, 98), (1520, 19), (1540, 23), (1564, 7), (1572, 31), (1604, 35),
                 (1640, 21), (1662, 4), (1668, 10), (1681, 4), (1688, 15), (1706, 4), (1711, 13), (1725, 3),
                 (1729, 1), (1731, 3), (1736, 12), (1749, 47), (1798, 70), (1869, 108), (1978, 2), (1981, 9),
                 (1992, 6), (1999, 31), (2031, 24), (2056, 105))
SMOKE = {"pages": 30, "page_size": 4, "topk": 16, "heads": 4, "lens": (3, 16, 5), "long_row": 1, "context": 20,
         "runs": ((0, 5), (6, 4), (12, 7))}


def _sparse_indices(setup, device):
    contexts = [setup["context"] if b == setup["long_row"] else n for b, n in enumerate(setup["lens"])]
    page_size = setup["page_size"]
    counts = [-(-n // page_size) for n in contexts]
    pages = torch.randperm(setup["pages"], device=device)[:sum(counts)]
    indices = torch.full((len(contexts), setup["topk"]), -1, dtype=torch.int32, device=device)
    start = 0
    for b, count in enumerate(counts):
        mine = pages[start:start + count]
        start += count
        if b == setup["long_row"]:
            logical = torch.cat([torch.arange(s, s + n, device=device) for s, n in setup["runs"]])
        else:
            logical = torch.arange(setup["lens"][b], device=device)
        slots = mine[logical // page_size] * page_size + logical % page_size
        indices[b, :slots.numel()] = slots.sort().values.to(torch.int32)
    return indices


def make_inputs(device="cuda", scale="full"):
    setup = SMOKE if scale != "full" else {
        "pages": NUM_PAGES, "page_size": PAGE_SIZE, "topk": TOPK, "heads": 16, "lens": SELECT_LENS,
        "long_row": LONG_ROW, "context": LONG_ROW_CONTEXT, "runs": LONG_ROW_RUNS}
    tokens, heads, bf16 = len(setup["lens"]), setup["heads"], torch.bfloat16
    q_nope = torch.randn(tokens, heads, 512, device=device, dtype=bf16)
    q_pe = torch.randn(tokens, heads, 64, device=device, dtype=bf16)
    ckv_cache = torch.randn(setup["pages"], setup["page_size"], 512, device=device, dtype=bf16)
    kpe_cache = torch.randn(setup["pages"], setup["page_size"], 64, device=device, dtype=bf16)
    return [q_nope, q_pe, ckv_cache, kpe_cache, _sparse_indices(setup, device), SM_SCALE]


def reference(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale):
    compute = torch.promote_types(q_nope.dtype, torch.float32)
    unused = sparse_indices < 0
    slots = sparse_indices.long().clamp(min=0)
    ckv = ckv_cache.reshape(-1, ckv_cache.shape[-1])[slots].to(compute)
    kpe = kpe_cache.reshape(-1, kpe_cache.shape[-1])[slots].to(compute)
    logits = (q_nope.to(compute) @ ckv.transpose(1, 2) + q_pe.to(compute) @ kpe.transpose(1, 2)) * sm_scale
    logits = logits.masked_fill(unused[:, None, :], float("-inf"))
    lse = torch.logsumexp(logits, dim=-1) / math.log(2.0)
    out = (torch.softmax(logits, dim=-1) @ ckv).to(q_nope.dtype)
    return out, lse
