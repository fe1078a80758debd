"""Gated DeltaNet decode step (one token per sequence): L2-normalise q, k; decay the fp32 state by exp(g), delta-rule update with beta, read out o = (q / sqrt(128)) . S; return (o bf16 [B, 1, 16, 128], new state fp32 [B, 16, 128, 128])."""
# Source: Qwen3-Next-80B-A3B config.json: linear_num_key_heads 16, linear_num_value_heads 32,
# linear_key_head_dim 128, linear_value_head_dim 128; tensor parallel 2 gives 8 q/k heads and
# 16 v heads per GPU; value head h reads q/k head h // 2. Gated delta rule (Yang et al., "Gated
# Delta Networks"), with q/k L2-normalised inside the kernel (eps 1e-6) and q scaled by 1/sqrt(128).
# Per head, with state S [K=128, V=128] (key index first):
#   g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b)
#   S <- exp(g) * S;  delta = beta * (v - k^T S);  S <- S + k delta^T;  o = q^T S
# Layout: q, k [B, 1, 8, 128] bf16; v [B, 1, 16, 128] bf16; a, b [B, 1, 16] bf16 (the per-token
# gate projections); A_log, dt_bias fp32 [16]; state fp32 [B, 16, 128, 128] (state[b, h, i, j]:
# key dim i, value dim j). All math in fp32; o rounded to bf16, the state returned in fp32.
# Workload: batch 64 decode requests, T = 1. Fixed: shapes.
# Redrawn per draw: q, k, v, a, b ~ N(0, 1); A_log = log(U(1, 16)); dt_bias = softplus^-1(dt) with
# dt log-uniform in [1e-3, 1e-1] (per-step decays exp(g) roughly 0.2..0.99); state ~ N(0, 1).
# The input state is not modified: the new state is a fresh tensor.
import torch

DTYPE = "bf16"
SOL = {
    "flops": 7 * 64 * 16 * 128 * 128,
    "bytes": 2 * 4 * 64 * 16 * 128 * 128 + 2 * 2 * 64 * 8 * 128 + 2 * 64 * 16 * 128 + 2 * 2 * 64 * 16
    + 2 * 4 * 16 + 2 * 64 * 16 * 128,
}

L2_EPS = 1e-6


def make_inputs(device="cuda", scale="full"):
    batch, k_heads, v_heads, dk, dv = (64, 8, 16, 128, 128) if scale == "full" else (3, 2, 4, 16, 16)
    q = torch.randn(batch, 1, k_heads, dk, device=device).to(torch.bfloat16)
    k = torch.randn(batch, 1, k_heads, dk, device=device).to(torch.bfloat16)
    v = torch.randn(batch, 1, v_heads, dv, device=device).to(torch.bfloat16)
    a = torch.randn(batch, 1, v_heads, device=device).to(torch.bfloat16)
    b = torch.randn(batch, 1, v_heads, device=device).to(torch.bfloat16)
    A_log = torch.log(1.0 + 15.0 * torch.rand(v_heads, device=device))
    dt = torch.exp(torch.empty(v_heads, device=device).uniform_(-6.9078, -2.3026))
    dt_bias = dt + torch.log(-torch.expm1(-dt))
    state = torch.randn(batch, v_heads, dk, dv, device=device)
    return [q, k, v, a, b, A_log, dt_bias, state]


def _l2norm(x):
    return x * torch.rsqrt(x.pow(2).sum(dim=-1, keepdim=True) + L2_EPS)


def reference(q, k, v, a, b, A_log, dt_bias, state):
    compute = torch.promote_types(q.dtype, torch.float32)
    k_heads, dk = q.shape[2], q.shape[3]
    v_heads = v.shape[2]
    rep = v_heads // k_heads
    qf = (_l2norm(q[:, 0].to(compute)) * dk ** -0.5).repeat_interleave(rep, dim=1)
    kf = _l2norm(k[:, 0].to(compute)).repeat_interleave(rep, dim=1)
    vf = v[:, 0].to(compute)
    g = -torch.exp(A_log.to(compute)) * torch.nn.functional.softplus(a[:, 0].to(compute) + dt_bias.to(compute))
    beta = torch.sigmoid(b[:, 0].to(compute))
    s = state.to(compute) * torch.exp(g)[:, :, None, None]
    delta = (vf - torch.einsum("bhk,bhkv->bhv", kf, s)) * beta[:, :, None]
    s = s + kf[:, :, :, None] * delta[:, :, None, :]
    o = torch.einsum("bhk,bhkv->bhv", qf, s)
    return o[:, None].to(q.dtype), s.to(state.dtype)
