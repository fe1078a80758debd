"""Attention half of a FIBO/FLUX dual-stream (MM-DiT) block (fp32): AdaLN-Zero modulation of image and text streams from temb, per-stream qkv projections, per-head RMSNorm of q and k, 3-D RoPE, joint attention over [text | image] tokens, per-stream output projections and gated residuals; return (image, text, image MLP input, text MLP input)."""
# Source: Bria FIBO transformer config (BriaFiboTransformer2DModel, a modified FLUX transformer):
# num_attention_heads 24, attention_head_dim 128 (hidden 3072), joint_attention_dim 4096 (the
# text-encoder features are projected to 3072 by the model's context embedder before the blocks;
# this problem starts after it), axes_dims_rope (16, 56, 56), rope_theta 10000.
# Published semantics of the FLUX-style dual-stream block, attention half, per stream s in
# {image, text}: (shift, scale, gate, shift2, scale2, gate2) = chunk6(W_mod_s silu(temb) + b_mod_s)
# (AdaLN-Zero, 6 x 3072); h = LN(x_s) (1 + scale) + shift (LayerNorm without affine, eps 1e-6);
# q, k, v = h W_qkv_s^T + b; q, k: RMSNorm over each head's 128 dims (eps 1e-6, weight per stream);
# the text tokens come first in the joint sequence; RoPE rotates interleaved pairs (2i, 2i + 1) with
# the given cos/sin (3-D ids: text ids 0, image ids (t, h, w), axis dims 16/56/56); softmax
# attention over all 1,280 tokens, scale 128^-0.5, no mask; o_s = attn_s W_out_s^T + b;
# x_s' = x_s + gate * o_s; MLP input m_s = LN(x_s') (1 + scale2) + shift2. gate2 (the last 3072
# rows of the modulation) belongs to the MLP half and is not used here.
# Layout: image [4, 1024, 3072], text [4, 256, 3072], temb [4, 3072]; per stream: mod_w [18432, 3072],
# mod_b [18432], qkv_w [9216, 3072] ([q | k | v], head-major), qkv_b [9216], q_norm_w, k_norm_w [128],
# out_w [3072, 3072], out_b [3072]; rope_cos, rope_sin fp32 [1280, 128] (text rows first).
# Workload: batch 4, 1,024 image tokens (grid 4 x 16 x 16: ids (t, h, w)) + 256 text tokens.
# Fixed: shapes, ids, the cos/sin tables. Redrawn per draw: image, text, temb ~ N(0, 1); mod
# weights ~ 0.5 N(0, 1/3072), other weights ~ N(0, 1/3072), biases 0.02 N(0, 1), norm weights
# 1 + 0.1 N(0, 1).
import math

import torch
import torch.nn.functional as F

DTYPE = "fp32"
SOL = {
    "flops": 2 * 2 * 4 * 3072 * 18432 + 2 * 4 * 1280 * 3072 * 9216 + 4 * 4 * 24 * 1280 * 1280 * 128
    + 2 * 4 * 1280 * 3072 * 3072 + 30 * 4 * 1280 * 3072,
    "bytes": 4 * (4 * 1280 * 3072 + 4 * 3072 + 2 * (18432 * 3072 + 18432 + 9216 * 3072 + 9216 + 2 * 128
                                                    + 3072 * 3072 + 3072) + 2 * 1280 * 128)
    + 4 * 2 * 4 * 1280 * 3072,
}

HEADS, HEAD_DIM = 24, 128
AXES = (16, 56, 56)
THETA = 10000.0
EPS = 1e-6


def _rope_tables(grid, text_tokens, device):
    t, h, w = grid
    ids = torch.stack(torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij"), dim=-1)
    ids = torch.cat([torch.zeros(text_tokens, 3, dtype=torch.int64), ids.reshape(-1, 3)]).to(device)
    angles = []
    for axis, dim in enumerate(AXES):
        inv_freq = THETA ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim)
        angles.append(ids[:, axis:axis + 1].to(torch.float64) * inv_freq)
    angles = torch.cat(angles, dim=-1).repeat_interleave(2, dim=-1)      # [tokens, 128]
    return angles.cos().to(torch.float32), angles.sin().to(torch.float32)


def _stream_weights(hidden, device):
    def normal(*shape, std):
        return std * torch.randn(*shape, device=device)

    return [normal(6 * hidden, hidden, std=0.5 / math.sqrt(hidden)), normal(6 * hidden, std=0.02),
            normal(3 * hidden, hidden, std=1 / math.sqrt(hidden)), normal(3 * hidden, std=0.02),
            1 + normal(HEAD_DIM, std=0.1), 1 + normal(HEAD_DIM, std=0.1),
            normal(hidden, hidden, std=1 / math.sqrt(hidden)), normal(hidden, std=0.02)]


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        batch, heads, grid, text_tokens = 4, HEADS, (4, 16, 16), 256
    else:
        batch, heads, grid, text_tokens = 2, 2, (2, 2, 3), 4
    hidden = heads * HEAD_DIM
    image_tokens = grid[0] * grid[1] * grid[2]
    image = torch.randn(batch, image_tokens, hidden, device=device)
    text = torch.randn(batch, text_tokens, hidden, device=device)
    temb = torch.randn(batch, hidden, device=device)
    image_weights = _stream_weights(hidden, device)
    text_weights = _stream_weights(hidden, device)
    rope_cos, rope_sin = _rope_tables(grid, text_tokens, device)
    return [image, text, temb, *image_weights, *text_weights, rope_cos, rope_sin]


def _layer_norm(x):
    return F.layer_norm(x, x.shape[-1:], eps=EPS)


def _rms_norm(x, weight):
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + EPS) * weight


def _rope(x, cos, sin):
    pairs = x.unflatten(-1, (-1, 2))
    rotated = torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)
    return x * cos + rotated * sin


def reference(image, text, temb, img_mod_w, img_mod_b, img_qkv_w, img_qkv_b, img_q_norm_w, img_k_norm_w,
              img_out_w, img_out_b, txt_mod_w, txt_mod_b, txt_qkv_w, txt_qkv_b, txt_q_norm_w, txt_k_norm_w,
              txt_out_w, txt_out_b, rope_cos, rope_sin):
    compute = torch.promote_types(image.dtype, torch.float32)
    batch, _, hidden = image.shape
    heads = hidden // HEAD_DIM
    streams = [
        (text, txt_mod_w, txt_mod_b, txt_qkv_w, txt_qkv_b, txt_q_norm_w, txt_k_norm_w),
        (image, img_mod_w, img_mod_b, img_qkv_w, img_qkv_b, img_q_norm_w, img_k_norm_w),
    ]
    act = F.silu(temb.to(compute))
    mods, qs, ks, vs = [], [], [], []
    for x, mod_w, mod_b, qkv_w, qkv_b, q_norm_w, k_norm_w in streams:
        mod = F.linear(act, mod_w.to(compute), mod_b.to(compute))[:, None, :].chunk(6, dim=-1)
        mods.append(mod)
        shift, scale = mod[0], mod[1]
        h = _layer_norm(x.to(compute)) * (1 + scale) + shift
        qkv = F.linear(h, qkv_w.to(compute), qkv_b.to(compute))
        q, k, v = qkv.view(batch, -1, 3, heads, HEAD_DIM).unbind(2)
        qs.append(_rms_norm(q, q_norm_w.to(compute)))
        ks.append(_rms_norm(k, k_norm_w.to(compute)))
        vs.append(v)
    cos, sin = rope_cos.to(compute)[:, None, :], rope_sin.to(compute)[:, None, :]
    q = _rope(torch.cat(qs, dim=1), cos, sin).transpose(1, 2)
    k = _rope(torch.cat(ks, dim=1), cos, sin).transpose(1, 2)
    v = torch.cat(vs, dim=1).transpose(1, 2)
    attn = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(batch, -1, hidden)
    text_tokens = text.shape[1]
    outputs = {}
    for name, x, part, (out_w, out_b), mod in (
        ("text", text, attn[:, :text_tokens], (txt_out_w, txt_out_b), mods[0]),
        ("image", image, attn[:, text_tokens:], (img_out_w, img_out_b), mods[1]),
    ):
        gate, shift2, scale2 = mod[2], mod[3], mod[4]
        x_new = x.to(compute) + gate * F.linear(part, out_w.to(compute), out_b.to(compute))
        outputs[name] = (x_new, _layer_norm(x_new) * (1 + scale2) + shift2)
    return (outputs["image"][0].to(image.dtype), outputs["text"][0].to(text.dtype),
            outputs["image"][1].to(image.dtype), outputs["text"][1].to(text.dtype))
