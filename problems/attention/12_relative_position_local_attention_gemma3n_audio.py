"""Gemma-3n audio-encoder local attention (fp32): q/k/v projections, per-dim softplus query scaling, causal window of 13 keys (the query and 12 before it) with logits q.(k + P[i-j]) from projected sinusoidal relative-position embeddings, tanh soft cap, padded keys (mask True) excluded; return the attention context [batch, frames, 8, 64]."""
# Source: the conformer attention of Gemma-3n's audio encoder (8 heads; chunk 12, context left 13
# (12 frames back), context right 0; per-dimension query scale head_dim^-0.5 / softplus(0) *
# softplus(per_dim_scale); relative-position term from sinusoids [sin(d t) | cos(d t)] of the distance
# d = i - j, projected by pos_proj to heads; logits soft-capped as cap * tanh(logit / cap) before the
# masked softmax) in the shape of the original MetaKernelBench p12 (a SOL-ExecBench recipe; only
# part of its text is visible): batch 64 x 1,721 frames, hidden 512, 256 timescales, valid lengths
# drawn in 1,709..1,721 (SEQ_LEN - MAX_BACKWARD .. SEQ_LEN), the soft cap passed as a Python float.
# Layout: hidden_states [64, 1721, 512]; mask bool [64, 1721] (True = padded frame, never a key);
# q/k/v/pos_proj_weight [512, 512] (no bias); per_dim_scale [64]; inv_timescales [256]
# (t_m = exp(-m ln(1e4) / 255)). Padded frames still get outputs (their windows reach valid frames).
# Our reading where the recipe is hidden: 8 heads x 64, timescales 1..1e4, soft cap 50.0, the
# model's chunked formulation (blocks of 12 queries over 24-frame contexts), no zeroing of outputs
# at padded frames.
# Fixed: shapes, window, cap, timescales. Redrawn per draw: hidden_states ~ N(0, 1), weights ~
# N(0, 1/512), per_dim_scale 0.1 N(0, 1), the valid lengths.
import math

import torch
import torch.nn.functional as F

DTYPE = "fp32"
SOL = {
    "flops": 3 * 2 * 64 * 1721 * 512 * 512 + 2 * 13 * 512 * 512 + 6 * 64 * 1721 * 8 * 64 * 13,
    "bytes": 4 * 64 * 1721 * 512 + 64 * 1721 + 4 * 4 * 512 * 512 + 4 * 64 + 4 * 256 + 4 * 64 * 1721 * 512,
}

BATCH_SIZE, SEQ_LEN, HIDDEN_SIZE, NUM_HEADS = 64, 1721, 512, 8
NUM_TIMESCALES, MIN_TIMESCALE, MAX_TIMESCALE = 256, 1.0, 1.0e4
CHUNK, MAX_BACKWARD = 12, 12
ATTENTION_LOGITS_SOFT_CAP = 50.0


def make_inputs(device="cuda", scale="full"):
    batch, frames, hidden = (BATCH_SIZE, SEQ_LEN, HIDDEN_SIZE) if scale == "full" else (2, 29, 64)
    timescales = hidden // 2
    hidden_states = torch.randn(batch, frames, hidden, device=device)
    valid_lens = torch.randint(frames - MAX_BACKWARD, frames + 1, (batch,), device=device)
    mask = torch.arange(frames, device=device)[None, :] >= valid_lens[:, None]
    weights = [torch.randn(hidden, hidden, device=device) / math.sqrt(hidden) for _ in range(4)]
    per_dim_scale = 0.1 * torch.randn(hidden // NUM_HEADS, device=device)
    step = math.log(MAX_TIMESCALE / MIN_TIMESCALE) / max(timescales - 1, 1)
    inv_timescales = MIN_TIMESCALE * torch.exp(torch.arange(timescales, device=device, dtype=torch.float32) * -step)
    return [hidden_states, mask, *weights, per_dim_scale, inv_timescales, ATTENTION_LOGITS_SOFT_CAP]


def reference(hidden_states, mask, q_proj_weight, k_proj_weight, v_proj_weight, pos_proj_weight, per_dim_scale,
              inv_timescales, soft_cap):
    compute = torch.promote_types(hidden_states.dtype, torch.float32)
    batch, frames, hidden = hidden_states.shape
    dim = hidden // NUM_HEADS
    x = hidden_states.to(compute)
    q, k, v = ((x @ w.to(compute).T).view(batch, frames, NUM_HEADS, dim)
               for w in (q_proj_weight, k_proj_weight, v_proj_weight))
    q = q * (dim ** -0.5 / F.softplus(torch.zeros((), dtype=compute)) * F.softplus(per_dim_scale.to(compute)))
    distance = torch.arange(MAX_BACKWARD + 1, dtype=compute, device=x.device)[:, None] * inv_timescales.to(compute)
    signal = torch.cat([distance.sin(), distance.cos()], dim=-1)                     # [13, hidden]
    rel = (signal @ pos_proj_weight.to(compute).T).view(MAX_BACKWARD + 1, NUM_HEADS, dim)

    # query blocks of 12 frames; each sees a 24-frame context (12 before the block + the block)
    blocks = (frames + CHUNK - 1) // CHUNK
    padded = blocks * CHUNK
    context = CHUNK + MAX_BACKWARD
    qb = F.pad(q, (0, 0, 0, 0, 0, padded - frames)).view(batch, blocks, CHUNK, NUM_HEADS, dim)
    kc = F.pad(k, (0, 0, 0, 0, MAX_BACKWARD, padded - frames)).unfold(1, context, CHUNK)   # [b, u, h, d, c]
    vc = F.pad(v, (0, 0, 0, 0, MAX_BACKWARD, padded - frames)).unfold(1, context, CHUNK)
    content = torch.einsum("buwhd,buhdc->bhuwc", qb, kc)
    position = torch.einsum("buwhd,rhd->bhuwr", qb, rel)                            # r = distance 0..12
    w_idx = torch.arange(CHUNK, device=x.device)[:, None]
    c_idx = torch.arange(context, device=x.device)[None, :]
    gap = w_idx + MAX_BACKWARD - c_idx                                             # query w, context slot c
    in_window = (gap >= 0) & (gap <= MAX_BACKWARD)
    position = position.gather(-1, gap.clamp(0, MAX_BACKWARD).expand(*position.shape[:-1], context))
    logits = soft_cap * torch.tanh((content + position) / soft_cap)
    key_pos = torch.arange(blocks, device=x.device)[:, None] * CHUNK - MAX_BACKWARD + c_idx    # [u, c]
    in_range = (key_pos >= 0) & (key_pos < frames)
    padded_key = mask[:, key_pos.clamp(0, frames - 1)] | ~in_range[None]                    # [b, u, c]
    visible = in_window[None, None] & ~padded_key[:, None, :, None, :]                      # [b, 1, u, w, c]
    probs = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1)
    out = torch.einsum("bhuwc,buhdc->buwhd", probs, vc).reshape(batch, padded, NUM_HEADS, dim)
    return out[:, :frames]
