"""Vision-tower self-attention over variable-length images (bf16): qkv = x @ w_qkv.T + b_qkv, 2-D rotary embedding (rotate-half with the given cos/sin) on q and k, full bidirectional attention inside each image (cu_seqlens), then out = attn @ w_proj.T + b_proj; return out [tokens, 1152] (bf16)."""
# Source: the slot's vision encoder (Qwen-Image-Edit's multimodal condition path) has the Qwen3-VL
# vision-tower attention: hidden_size 1152, num_heads 16 (head_dim 72), qkv Linear 1152 -> 3 x 1152
# with bias, proj Linear 1152 -> 1152 with bias, patch 16 with spatial_merge_size 2. Images are
# packed back to back (cu_seqlens) and attend only within themselves, without a causal mask, with
# scale 72^-0.5. 2-D RoPE: per patch (row h, column w), inv_freq f_i = 10000^(-2i/36), i < 18;
# angles [h f_0..h f_17, w f_0..w f_17] repeated twice to 72 dims; q' = q cos + rotate_half(q) sin
# (pairs (i, i + 36)). Patches are ordered by 2 x 2 merge window (windows row-major, then the 4
# patches of a window row-major), so cos/sin follow that order.
# Layout: x [tokens, 1152] (the block's normalised input), w_qkv [3456, 1152] ([q | k | v], each
# head-major), b_qkv [3456], w_proj [1152, 1152], b_proj [1152], rotary cos, sin fp32
# [tokens, 72], cu_seqlens int32 [29].
# The projections run in bf16 (fp32 accumulation), RoPE in fp32 rounded to bf16, attention on bf16
# q/k/v with fp32 softmax.
# Workload: 7,168 patch tokens in 28 images (a fixed set of 28 patch grids such as 16 x 16, 4 x 62, 8 x 14, 20 x 20;
# 112..400 tokens each, in random order per draw). Fixed: shapes, the grid set. Redrawn per draw:
# x ~ N(0, 1), weights ~ N(0, 1/1152), biases 0.02 N(0, 1), the image order (cu_seqlens, cos/sin).
import math

import torch
import torch.nn.functional as F

DTYPE = "bf16"
SOL = {
    "flops": 2 * 7168 * 1152 * 3456 + 2 * 7168 * 1152 * 1152 + 4 * 16 * 72 * 1959776 + 6 * 7168 * 2 * 1152,
    "bytes": 2 * 7168 * 1152 + 2 * 3456 * 1152 + 2 * 3456 + 2 * 1152 * 1152 + 2 * 1152 + 2 * 4 * 7168 * 72
    + 4 * 29 + 2 * 7168 * 1152,
}
# 1,959,776 = sum over the 28 images of tokens^2.

HIDDEN, HEADS, HEAD_DIM = 1152, 16, 72
GRIDS = [(16, 16), (16, 16), (12, 20), (8, 34), (8, 24), (16, 20), (10, 20), (12, 26), (20, 20), (8, 14),
         (24, 16), (8, 16), (12, 12), (8, 46), (22, 12), (4, 62), (28, 8), (16, 18), (14, 18), (10, 26),
         (6, 32), (20, 16), (26, 10), (14, 18), (32, 8), (16, 16), (18, 14), (10, 26)]
SMOKE_GRIDS = [(2, 4), (4, 4), (2, 2)]


def _grid_positions(h, w, device):
    """(row, col) of each patch in 2 x 2 merge-window order."""
    rows = torch.arange(h, device=device)[:, None].expand(h, w)
    cols = torch.arange(w, device=device)[None, :].expand(h, w)

    def window_order(t):
        return t.reshape(h // 2, 2, w // 2, 2).permute(0, 2, 1, 3).reshape(-1)

    return window_order(rows), window_order(cols)


def _rotary(grids, device):
    inv_freq = 10000.0 ** (-torch.arange(0, HEAD_DIM // 2, 2, dtype=torch.float64, device=device) / (HEAD_DIM // 2))
    angles = []
    for h, w in grids:
        rows, cols = _grid_positions(h, w, device)
        angles.append(torch.cat([rows[:, None] * inv_freq, cols[:, None] * inv_freq], dim=-1))
    angles = torch.cat(angles).repeat(1, 2)
    return angles.cos().to(torch.float32), angles.sin().to(torch.float32)


def make_inputs(device="cuda", scale="full"):
    grids = GRIDS if scale == "full" else SMOKE_GRIDS
    order = torch.randperm(len(grids)).tolist()
    grids = [grids[i] for i in order]
    lengths = torch.tensor([h * w for h, w in grids], device=device)
    tokens = int(lengths.sum())
    cu_seqlens = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(torch.int32)
    x = torch.randn(tokens, HIDDEN, device=device).to(torch.bfloat16)
    w_qkv = (torch.randn(3 * HIDDEN, HIDDEN, device=device) / math.sqrt(HIDDEN)).to(torch.bfloat16)
    b_qkv = (0.02 * torch.randn(3 * HIDDEN, device=device)).to(torch.bfloat16)
    w_proj = (torch.randn(HIDDEN, HIDDEN, device=device) / math.sqrt(HIDDEN)).to(torch.bfloat16)
    b_proj = (0.02 * torch.randn(HIDDEN, device=device)).to(torch.bfloat16)
    cos, sin = _rotary(grids, device)
    return [x, w_qkv, b_qkv, w_proj, b_proj, cos, sin, cu_seqlens]


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def reference(x, w_qkv, b_qkv, w_proj, b_proj, cos, sin, cu_seqlens):
    compute = torch.promote_types(x.dtype, torch.float32)
    tokens = x.shape[0]
    q, k, v = F.linear(x, w_qkv, b_qkv).view(tokens, 3, HEADS, HEAD_DIM).unbind(1)
    c, s = cos.to(compute)[:, None, :], sin.to(compute)[:, None, :]
    q = (q.to(compute) * c + _rotate_half(q.to(compute)) * s).to(x.dtype)
    k = (k.to(compute) * c + _rotate_half(k.to(compute)) * s).to(x.dtype)
    # pack the images into a padded batch [images, heads, longest, 72] with a key mask
    starts, lengths = cu_seqlens[:-1].long(), (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    j = torch.arange(int(lengths.max()), device=x.device)
    valid = j[None, :] < lengths[:, None]
    index = torch.where(valid, starts[:, None] + j[None, :], torch.zeros_like(j)[None, :])
    qb, kb, vb = (t[index].transpose(1, 2) for t in (q, k, v))
    attn = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=valid[:, None, None, :])
    attn = attn.transpose(1, 2)[valid].reshape(tokens, HIDDEN)
    return F.linear(attn, w_proj, b_proj)
