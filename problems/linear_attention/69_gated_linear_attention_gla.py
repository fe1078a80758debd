"""Chunked gated linear attention (GLA): per-key-channel fp32 log-decay gk, S_t = Diag(exp(gk_t)) S_{t-1} + k_t v_t^T, o_t = S_t^T q_t * K^-0.5, zero initial state, 4 heads with K 256 / V 512; returns bf16 o [B,T,4,512]."""
# Source: GLA (Yang et al., 2024, "Gated Linear Attention Transformers with Hardware-Efficient
# Training"), 1.3B configuration: hidden 2048, 4 heads, expand_k 0.5 and expand_v 1, so each head
# has key dim 1024 / 4 = 256 and value dim 2048 / 4 = 512; the forget gate is
# gk = logsigmoid(W_gk x) / 16 (gate_logit_normalizer 16), one log-decay per key channel.
# Workload: 8 sequences x 1024 tokens.
# Reference algorithm: chunks of 64; intra-chunk decays are formed pairwise, exp(G_t - G_i) per
# channel with G the in-chunk cumulative log-decay (no overflow for any gate), the inter-chunk
# state is carried in fp32; output rounded to bf16 once.
# Fixed: shapes. Redrawn per draw: q, k, v (N(0,1), bf16); gk = logsigmoid(N(0,1)) / 16 (fp32).
import torch
import torch.nn.functional as F

DTYPE = "bf16"
SOL = {
    "flops": 8 * 4 * 1024 * (4 * 256 * 512 + 2 * 64 * 256 + 2 * 64 * 512),
    "bytes": 2 * (2 * 8 * 1024 * 4 * 256 + 8 * 1024 * 4 * 512) + 4 * 8 * 1024 * 4 * 256
    + 2 * 8 * 1024 * 4 * 512,
}

CHUNK = 64


def _chunk_gla(q, k, v, g, chunk):
    """q, k, g [B,H,T,K]; v [B,H,T,V]; zero initial state -> o [B,H,T,V]."""
    b, h, t, dk = k.shape
    n = t // chunk
    q, k, v, g = (x.reshape(b, h, n, chunk, x.shape[-1]) for x in (q, k, v, g))
    gam = g.cumsum(3)
    incl = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    # pair[..., t, i, :] = exp(G_t - G_i) * k_i for i <= t (else 0)
    pair = gam[..., :, None, :] - gam[..., None, :, :]
    pair.masked_fill_(~incl[:, :, None], float("-inf")).exp_().mul_(k[..., None, :, :])
    intra = (pair @ q[..., None]).squeeze(-1) @ v
    del pair
    q_plus = q * gam.exp()
    last = gam[..., -1, :]
    k_tail = k * (last[..., None, :] - gam).exp()
    state = q.new_zeros(b, h, dk, v.shape[-1])
    o = torch.empty_like(v)
    for i in range(n):
        o[:, :, i] = q_plus[:, :, i] @ state + intra[:, :, i]
        state = last[:, :, i, :, None].exp() * state + k_tail[:, :, i].transpose(-1, -2) @ v[:, :, i]
    return o.reshape(b, h, t, -1)


def make_inputs(device="cuda", scale="full"):
    batch, seq, heads, dk, dv = (8, 1024, 4, 256, 512) if scale == "full" else (2, 32, 2, 16, 32)
    q = torch.randn(batch, seq, heads, dk, device=device).to(torch.bfloat16)
    k = torch.randn(batch, seq, heads, dk, device=device).to(torch.bfloat16)
    v = torch.randn(batch, seq, heads, dv, device=device).to(torch.bfloat16)
    gk = F.logsigmoid(torch.randn(batch, seq, heads, dk, device=device)) / 16
    return [q, k, v, gk]


def reference(q, k, v, gk):
    cdt = torch.promote_types(q.dtype, torch.float32)
    dk = q.shape[-1]
    chunk = CHUNK if dk == 256 else 8  # smoke shapes use chunks of 8
    o = _chunk_gla((q.to(cdt) * dk ** -0.5).transpose(1, 2), k.to(cdt).transpose(1, 2),
                   v.to(cdt).transpose(1, 2), gk.to(cdt).transpose(1, 2), chunk)
    return o.transpose(1, 2).to(v.dtype)
