"""Kimi Delta Attention recurrence (channel-wise gated delta rule) from a zero state: q and k L2-normalised inside, q scaled by 128^-0.5, per-channel log-decay g [B,T,H,128] and beta [B,T,H] (bf16), token-by-token state update; returns bf16 o [B,T,H,128]."""
# Source: Kimi Linear (Moonshot AI): Kimi Delta Attention refines Gated DeltaNet with a channel-wise
# (per key dimension) forget gate. Recurrence per head (S is [K, V]):
#   S'_t = Diag(exp(g_t)) S_{t-1},   S_t = S'_t + beta_t k_t (v_t - S'_t^T k_t)^T,   o_t = S_t^T q_t.
# Original (MetaKernelBench p68, after flash-linear-attention's naive recurrent KDA): inputs q, k, v
# [8, 1024, 16, 128], g = logsigmoid(N(0,1)) / 16 rounded to bf16, beta = sigmoid(N(0,1)), all bf16;
# q and k normalised with F.normalize semantics (x / max(||x||, 1e-12)).
# Reference: the token loop (the recurrence is the definition), each step vectorised over batch and
# heads, fp32 (fp64 in the anchor); o rounded to bf16 once.
# Workload: 8 sequences x 1024 tokens, 16 heads, K = V = 128. Fixed: shapes.
# Redrawn per draw: q, k, v (N(0,1)), g, beta (as above).
import torch
import torch.nn.functional as F

DTYPE = "bf16"
SOL = {
    "flops": 8 * 16 * 1024 * 8 * 128 * 128,
    "bytes": 2 * (4 * 8 * 1024 * 16 * 128 + 8 * 1024 * 16) + 2 * 8 * 1024 * 16 * 128,
}


def _l2normalize(x):
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def make_inputs(device="cuda", scale="full"):
    batch, seq, heads, d = (8, 1024, 16, 128) if scale == "full" else (2, 24, 2, 16)
    bf = torch.bfloat16
    q = torch.randn(batch, seq, heads, d, device=device, dtype=bf)
    k = torch.randn(batch, seq, heads, d, device=device, dtype=bf)
    v = torch.randn(batch, seq, heads, d, device=device, dtype=bf)
    g = (F.logsigmoid(torch.randn(batch, seq, heads, d, device=device)) / 16.0).to(bf)
    beta = torch.randn(batch, seq, heads, device=device, dtype=bf).sigmoid()
    return [q, k, v, g, beta]


def reference(q, k, v, g, beta):
    cdt, out_dtype = torch.promote_types(v.dtype, torch.float32), v.dtype
    q, k, v, g, beta = (x.to(cdt) for x in (q, k, v, g, beta))
    q = _l2normalize(q) * q.shape[-1] ** -0.5
    k = _l2normalize(k)
    b, t, h, dk = q.shape
    state = q.new_zeros(b, h, dk, v.shape[-1])
    o = torch.empty_like(v)
    for i in range(t):
        state = state * g[:, i, :, :, None].exp()
        k_i = k[:, i]
        delta = v[:, i] - torch.einsum("bhk,bhkv->bhv", k_i, state)
        state = state + (beta[:, i, :, None] * k_i)[..., None] * delta[:, :, None, :]
        o[:, i] = torch.einsum("bhk,bhkv->bhv", q[:, i], state)
    return o.to(out_dtype)
