"""Kimi Delta Attention (chunked gated delta rule with per-channel decay): in-kernel L2 norm of q and k, fp32 per-channel log-decay g [B,T,H,128], bf16 beta, zero initial state; returns bf16 o [B,T,H,128]."""
# Source: Kimi Linear (Moonshot AI, Kimi-Linear-48B-A3B): Kimi Delta Attention refines Gated
# DeltaNet with a channel-wise (per key dimension) forget gate; its KDA layers have 32 heads of
# head_dim 128, L2-normalise q and k in the kernel and scale q by 128^-0.5; the gate is
# g = -exp(A_log) * softplus(f(x) + dt_bias) per channel. We take 16 heads (a 2-way
# tensor-parallel shard). Recurrence per head (S is [K, V], alpha_t = exp(g_t) a K-vector):
#   S'_t = Diag(alpha_t) S_{t-1},   S_t = S'_t + beta_t k_t (v_t - S'_t^T k_t)^T,   o_t = S_t^T q_t.
# Workload: 8 sequences x 1024 tokens, 16 heads, K = V = 128, zero initial state.
# Reference algorithm: chunks of 32 with the UT/WY transform; intra-chunk decays are formed
# pairwise, exp(G_t - G_i) per channel with G the in-chunk cumulative log-decay, so nothing
# overflows for any gate strength; accumulation in fp32, output rounded to bf16 once.
# Fixed: shapes. Redrawn per draw: q, k, v (N(0,1), bf16); g = -exp(A_log) * softplus(z + dt_bias)
# with A_log = log U(1, 16) per head, dt = softplus(dt_bias) log-uniform in [1e-3, 1e-1] per head
# and channel, z ~ N(0,1) (fp32); beta = sigmoid(N(0,1)) (bf16).
import torch
import torch.nn.functional as F

DTYPE = "bf16"
SOL = {
    "flops": 8 * 16 * 1024 * (6 * 128 * 128 + 6 * 64 * 128 + 2 * 64 * 64),
    "bytes": 2 * (3 * 8 * 1024 * 16 * 128 + 8 * 1024 * 16) + 4 * 8 * 1024 * 16 * 128
    + 2 * 8 * 1024 * 16 * 128,
}

CHUNK, EPS = 32, 1e-6


def _l2norm(x):
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + EPS)


def _chunk_kda(q, k, v, g, beta, chunk):
    """q, k, g [B,H,T,K]; v [B,H,T,V]; beta [B,H,T]; zero initial state -> o [B,H,T,V]."""
    b, h, t, dk = k.shape
    n = t // chunk
    q, k, v, g = (x.reshape(b, h, n, chunk, x.shape[-1]) for x in (q, k, v, g))
    beta = beta.reshape(b, h, n, chunk)
    gam = g.cumsum(3)
    ones = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device)
    strict, incl = ones.tril(-1), ones.tril()
    # pair[..., t, i, :] = exp(G_t - G_i) * k_i for i <= t (else 0)
    pair = gam[..., :, None, :] - gam[..., None, :, :]
    pair.masked_fill_(~incl[:, :, None], float("-inf")).exp_().mul_(k[..., None, :, :])
    a_kk = (pair @ k[..., None]).squeeze(-1).masked_fill_(~strict, 0) * beta[..., None]
    a_qk = (pair @ q[..., None]).squeeze(-1)
    del pair
    eye = torch.eye(chunk, dtype=q.dtype, device=q.device)
    t_inv = torch.linalg.solve_triangular(eye + a_kk, eye.expand_as(a_kk), upper=False, unitriangular=True)
    decay = gam.exp()
    w = t_inv @ (k * decay * beta[..., None])
    u = t_inv @ (v * beta[..., None])
    q_plus = q * decay
    last = gam[..., -1, :]
    k_tail = k * (last[..., None, :] - gam).exp()
    state = q.new_zeros(b, h, dk, v.shape[-1])
    o = torch.empty_like(v)
    for i in range(n):
        delta = u[:, :, i] - w[:, :, i] @ state
        o[:, :, i] = q_plus[:, :, i] @ state + a_qk[:, :, i] @ delta
        state = last[:, :, i, :, None].exp() * state + k_tail[:, :, i].transpose(-1, -2) @ delta
    return o.reshape(b, h, t, -1)


def make_inputs(device="cuda", scale="full"):
    batch, seq, heads, d = (8, 1024, 16, 128) if scale == "full" else (2, 32, 2, 16)
    q = torch.randn(batch, seq, heads, d, device=device).to(torch.bfloat16)
    k = torch.randn(batch, seq, heads, d, device=device).to(torch.bfloat16)
    v = torch.randn(batch, seq, heads, d, device=device).to(torch.bfloat16)
    a_log = torch.log(torch.empty(heads, 1, device=device).uniform_(1, 16))
    dt = torch.exp(torch.empty(heads, d, device=device).uniform_(-6.9, -2.3))
    dt_bias = dt + torch.log(-torch.expm1(-dt))
    g = -a_log.exp() * F.softplus(torch.randn(batch, seq, heads, d, device=device) + dt_bias)
    beta = torch.sigmoid(torch.randn(batch, seq, heads, device=device)).to(torch.bfloat16)
    return [q, k, v, g, beta]


def reference(q, k, v, g, beta):
    cdt = torch.promote_types(q.dtype, torch.float32)
    dk = q.shape[-1]
    chunk = CHUNK if q.shape[1] % CHUNK == 0 and dk == 128 else 8  # smoke shapes use chunks of 8
    o = _chunk_kda(
        (_l2norm(q.to(cdt)) * dk ** -0.5).transpose(1, 2), _l2norm(k.to(cdt)).transpose(1, 2),
        v.to(cdt).transpose(1, 2), g.to(cdt).transpose(1, 2), beta.to(cdt).transpose(1, 2), chunk)
    return o.transpose(1, 2).to(v.dtype)
