"""Chunked gated delta rule (Gated DeltaNet prefill) with in-kernel L2 norm of q and k, 8 q/k heads shared by 16 v heads, fp32 initial state: returns bf16 o [B,T,16,128] and the fp32 final state [B,16,128,128]."""
# Source: Qwen3-Next-80B-A3B config.json: linear_num_key_heads 16, linear_num_value_heads 32,
# linear_key_head_dim 128, linear_value_head_dim 128; its Gated DeltaNet layers L2-normalise q and k
# (eps 1e-6), scale q by 128^-0.5 and share each q/k head among 2 consecutive v heads (v head h
# reads q/k head h // 2). We take a 2-way tensor-parallel shard: 8 q/k heads, 16 v heads. Slot
# change: the slot's 4 k heads per 16 v heads is not Qwen3-Next's 1 : 2 sharing; we use 8 : 16.
# Recurrence per v head (S is [K, V], alpha_t = exp(g_t)):
#   S_t = alpha_t S_{t-1} + beta_t k_t (v_t - alpha_t S_{t-1}^T k_t)^T,   o_t = S_t^T q_t.
# Workload: 16 sequences x 256 tokens, chunk size 64 (the WY / UT-transform chunked algorithm).
# Precision (part of the definition): accumulation and the carried state are fp32; the operands
# a chunked tensor-core kernel feeds in bf16 are rounded to the input dtype, as in production
# kernels: normalised q/k, the inverted intra-chunk matrix (I + A)^-1, the WY factors w and u, the
# state when it multiplies w and q, the new values v - w S, the intra-chunk q k^T scores and the
# decayed new values added to the state. This sets the accuracy the fp32 final state is held to;
# a kernel that keeps everything in fp32 is more accurate and passes too.
# Fixed: shapes, chunk size. Redrawn per draw: q, k, v (N(0,1), bf16); g = -exp(A_log) *
# softplus(a + dt_bias) with A_log = log U(1, 16), dt = softplus(dt_bias) log-uniform in
# [1e-3, 1e-1], a ~ N(0,1) (fp32); beta = sigmoid(N(0,1)) (bf16); initial state N(0, 0.5^2) fp32.
import torch
import torch.nn.functional as F

DTYPE = "bf16"
SOL = {
    "flops": 16 * 16 * 256 * (8 * 128 * 128 + 4 * 64 * 128 + 2 * 64 * 64),
    "bytes": 2 * (2 * 16 * 256 * 8 * 128 + 16 * 256 * 16 * 128 + 16 * 256 * 16) + 4 * 16 * 256 * 16
    + 2 * 4 * 16 * 16 * 128 * 128 + 2 * 16 * 256 * 16 * 128,
}

CHUNK, EPS = 64, 1e-6


def _l2norm(x):
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + EPS)


def _chunk_gated_delta_rule(q, k, v, g, beta, state, chunk, lp):
    """q, k [B,H,T,K]; v [B,H,T,V]; g, beta [B,H,T]; state [B,H,K,V]; T a multiple of chunk.

    Returns (o [B,H,T,V], final state). Everything is in the compute dtype; lp is the dtype that
    kernel-side bf16 operands are rounded to.
    """
    def r(t):
        return t.to(lp).to(t.dtype)

    b, h, t, dk = k.shape
    n = t // chunk
    q, k, v = (x.reshape(b, h, n, chunk, x.shape[-1]) for x in (q, k, v))
    g, beta = g.reshape(b, h, n, chunk), beta.reshape(b, h, n, chunk)
    gam = g.cumsum(-1)
    diff = gam[..., :, None] - gam[..., None, :]
    ones = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device)
    strict, incl = ones.tril(-1), ones.tril()
    decay_strict = diff.masked_fill(~strict, float("-inf")).exp()
    decay_incl = diff.masked_fill(~incl, float("-inf")).exp()
    a_kk = beta[..., None] * (k @ k.transpose(-1, -2)) * decay_strict
    eye = torch.eye(chunk, dtype=q.dtype, device=q.device)
    t_inv = r(torch.linalg.solve_triangular(eye + a_kk, eye.expand_as(a_kk), upper=False, unitriangular=True))
    w = r(t_inv @ r(k * (beta * gam.exp())[..., None]))
    u = r(t_inv @ r(v * beta[..., None]))
    a_qk = r((q @ k.transpose(-1, -2)) * decay_incl)
    o = torch.empty_like(v)
    for i in range(n):
        s_lp = r(state)
        v_new = r(u[:, :, i] - w[:, :, i] @ s_lp)
        o[:, :, i] = gam[:, :, i, :, None].exp() * (q[:, :, i] @ s_lp) + a_qk[:, :, i] @ v_new
        last = gam[:, :, i, -1]
        tail = r(v_new * (last[..., None] - gam[:, :, i]).exp()[..., None])
        state = last.exp()[..., None, None] * state + k[:, :, i].transpose(-1, -2) @ tail
    return o.reshape(b, h, t, -1), state


def make_inputs(device="cuda", scale="full"):
    batch, seq, hk, hv, d = (16, 256, 8, 16, 128) if scale == "full" else (2, 24, 2, 4, 16)
    q = torch.randn(batch, seq, hk, d, device=device).to(torch.bfloat16)
    k = torch.randn(batch, seq, hk, d, device=device).to(torch.bfloat16)
    v = torch.randn(batch, seq, hv, d, device=device).to(torch.bfloat16)
    a_log = torch.log(torch.empty(hv, device=device).uniform_(1, 16))
    dt = torch.exp(torch.empty(hv, device=device).uniform_(-6.9, -2.3))
    dt_bias = dt + torch.log(-torch.expm1(-dt))
    g = -a_log.exp() * F.softplus(torch.randn(batch, seq, hv, device=device) + dt_bias)
    beta = torch.sigmoid(torch.randn(batch, seq, hv, device=device)).to(torch.bfloat16)
    initial_state = 0.5 * torch.randn(batch, hv, d, d, device=device)
    return [q, k, v, g, beta, initial_state]


def reference(q, k, v, g, beta, initial_state):
    cdt = torch.promote_types(q.dtype, torch.float32)
    lp = q.dtype
    b, t, hk, dk = q.shape
    hv = v.shape[2]
    chunk = CHUNK if t % CHUNK == 0 else 8  # smoke sequences (24 tokens) use chunks of 8

    def heads(x):  # [B,T,Hk,D] -> normalised, repeated to v heads, rounded like a kernel: [B,Hv,T,D]
        x = _l2norm(x.to(cdt)).to(lp).to(cdt)
        return x.repeat_interleave(hv // hk, dim=2).transpose(1, 2)

    o, state = _chunk_gated_delta_rule(
        heads(q) * dk ** -0.5, heads(k), v.to(cdt).transpose(1, 2), g.to(cdt).transpose(1, 2),
        beta.to(cdt).transpose(1, 2), initial_state.to(cdt), chunk, lp)
    return o.transpose(1, 2).to(v.dtype), state.to(initial_state.dtype)
