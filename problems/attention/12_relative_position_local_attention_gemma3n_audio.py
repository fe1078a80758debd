"""Gemma-3n audio-encoder local attention (fp32): q/k/v projections, per-dim softplus query scaling, causal window of 13 keys (the query and 12 before it) with logits q.(k + P[i-j]) from projected sinusoidal relative-position embeddings, tanh soft cap 50, padding mask from lengths; return the attention context [batch, frames, 8, 192] (zero at padded frames)."""
# Source: Gemma-3n audio config (google/gemma-3n-E4B, audio_config): hidden_size 1536,
# conf_num_attention_heads 8 (head_dim 192), conf_attention_chunk_size 12,
# conf_attention_context_left 13, conf_attention_context_right 0, conf_attention_logit_cap 50.
# Published semantics of its conformer attention: q, k, v = x W^T (no bias); q is scaled per
# dimension by head_dim^-0.5 / softplus(0) * softplus(per_dim_scale); key j is visible from query i
# when i - 12 <= j <= i and j is a valid (unpadded) frame; the logit is q_i . k_j + q_i . P[i - j]
# where P[d] = W_pos [sin(d * t) | cos(d * t)] (768 timescales t_m = exp(-m ln(1e4) / 767), W_pos:
# 1536 -> 8 x 192, no bias); logits are soft-capped as 50 tanh(logit / 50) before the masked softmax.
# Fix to the slot: the slot said hidden 512 with 256 timescales; the model's hidden size is 1536,
# so 1536 (768 timescales, 8 heads x 192) is used.
# Layout: x [64, 1721, 1536]; lengths int64 [64] (frames >= length are padding; their output rows
# are 0); w_q, w_k, w_v, w_pos [1536, 1536]; per_dim_scale [192].
# Workload: batch 64 x 1,721 frames (about 69 s of audio at 25 frames/s). Fixed: shapes, window,
# cap. Redrawn per draw: x ~ 2 N(0, 1), weights ~ N(0, 1/1536), per_dim_scale 0.1 N(0, 1), lengths
# uniform in 861..1,721 (one of them 1,721).
import math

import torch
import torch.nn.functional as F

DTYPE = "fp32"
SOL = {
    "flops": 3 * 2 * 64 * 1721 * 1536 * 1536 + 2 * 13 * 1536 * 1536 + 6 * 64 * 1721 * 8 * 192 * 13,
    "bytes": 4 * 64 * 1721 * 1536 + 8 * 64 + 4 * 4 * 1536 * 1536 + 4 * 192 + 4 * 64 * 1721 * 1536,
}

HEADS, CHUNK, LEFT, CAP = 8, 12, 12, 50.0


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        batch, frames, hidden = 64, 1721, 1536
    else:
        batch, frames, hidden = 2, 29, 64
    x = 2.0 * torch.randn(batch, frames, hidden, device=device)
    w_q, w_k, w_v, w_pos = (torch.randn(hidden, hidden, device=device) / math.sqrt(hidden) for _ in range(4))
    per_dim_scale = 0.1 * torch.randn(hidden // HEADS, device=device)
    lengths = torch.randint((frames + 1) // 2, frames + 1, (batch,), device=device)
    lengths[torch.randint(0, batch, (1,), device=device)] = frames
    return [x, lengths, w_q, w_k, w_v, per_dim_scale, w_pos]


def _relative_embeddings(w_pos, compute):
    hidden = w_pos.shape[1]
    timescales = hidden // 2
    step = math.log(1.0e4) / (timescales - 1)
    inv = torch.exp(-torch.arange(timescales, dtype=compute, device=w_pos.device) * step)
    distance = torch.arange(LEFT + 1, dtype=compute, device=w_pos.device)[:, None] * inv
    signal = torch.cat([distance.sin(), distance.cos()], dim=-1)              # [13, hidden]
    return (signal @ w_pos.to(compute).T).view(LEFT + 1, HEADS, -1)          # [13, heads, dim]


def reference(x, lengths, w_q, w_k, w_v, per_dim_scale, w_pos):
    compute = torch.promote_types(x.dtype, torch.float32)
    batch, frames, hidden = x.shape
    dim = hidden // HEADS
    xc = x.to(compute)
    q, k, v = ((xc @ w.to(compute).T).view(batch, frames, HEADS, dim) for w in (w_q, w_k, w_v))
    q_scale = dim ** -0.5 / math.log(2.0)                                     # softplus(0) = ln 2
    q = q * (q_scale * F.softplus(per_dim_scale.to(compute)))
    rel = _relative_embeddings(w_pos, compute)

    # query blocks of 12 frames; each sees a 24-frame context (12 before the block + the block)
    blocks = (frames + CHUNK - 1) // CHUNK
    padded = blocks * CHUNK
    qb = F.pad(q, (0, 0, 0, 0, 0, padded - frames)).view(batch, blocks, CHUNK, HEADS, dim)
    context = CHUNK + LEFT
    kc = F.pad(k, (0, 0, 0, 0, LEFT, padded - frames)).unfold(1, context, CHUNK)   # [b, u, h, d, c]
    vc = F.pad(v, (0, 0, 0, 0, LEFT, padded - frames)).unfold(1, context, CHUNK)
    content = torch.einsum("buwhd,buhdc->bhuwc", qb, kc)
    position = torch.einsum("buwhd,rhd->bhuwr", qb, rel)                     # r = distance 0..12
    w_idx = torch.arange(CHUNK, device=x.device)[:, None]
    c_idx = torch.arange(context, device=x.device)[None, :]
    distance = w_idx + LEFT - c_idx                                         # query w, context slot c
    in_window = (distance >= 0) & (distance <= LEFT)
    position = position.gather(-1, distance.clamp(0, LEFT).expand(*position.shape[:-1], context))
    logits = CAP * torch.tanh((content + position) / CAP)

    key_pos = torch.arange(blocks, device=x.device)[:, None] * CHUNK - LEFT + c_idx      # [u, c]
    key_valid = (key_pos[None] >= 0) & (key_pos[None] < lengths[:, None, None])        # [b, u, c]
    visible = in_window[None, None] & key_valid[:, None, :, None, :]                   # [b, 1, u, w, c]
    logits = torch.where(visible, logits, torch.finfo(compute).min)
    probs = torch.softmax(logits, dim=-1)
    out = torch.einsum("bhuwc,buhdc->buwhd", probs, vc).reshape(batch, padded, HEADS, dim)[:, :frames]
    query_valid = torch.arange(frames, device=x.device)[None, :] < lengths[:, None]
    return torch.where(query_valid[:, :, None, None], out, torch.zeros_like(out))
