"""Gated DeltaNet multi-token (MTP draft verification) step: for each of 32 requests, read its fp32 state from a pool by index, run the gated delta rule over 4 draft tokens (gates from raw a/b, in-kernel L2 norm of q/k, 8 q/k heads shared by 16 v heads); returns bf16 o [32,4,16,128] and the true fp32 final states [32,16,128,128]."""
# Source: Qwen3-Next-80B-A3B config.json: linear_num_key_heads 16, linear_num_value_heads 32,
# linear_key_head_dim 128, linear_value_head_dim 128; the model ships a multi-token-prediction
# head, and its drafts are verified by running several tokens per request through every layer
# in one step. Its Gated DeltaNet computes
# g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b), L2-normalises q and k (eps 1e-6),
# scales q by 128^-0.5 and shares each q/k head among 2 consecutive v heads (v head h reads q/k
# head h // 2). 2-way tensor-parallel shard: 8 q/k heads, 16 v heads.
# Recurrence per request and v head (S is [K, V], alpha_t = exp(g_t)):
#   S_t = alpha_t S_{t-1} + beta_t k_t (v_t - alpha_t S_{t-1}^T k_t)^T,   o_t = S_t^T q_t,
# starting from state_pool[state_indices[b]]; the state after the 4th token is returned (the real
# final state: a known defect elsewhere returns a copy of the initial state instead).
# Workload: 32 requests x 4 tokens; state pool of 49 slots, the 32 requests use distinct slots.
# Precision: the recurrence is done token by token in fp32 (decode kernels keep the state fp32).
# Fixed: shapes. Redrawn per draw: q, k, v, a, b (N(0,1), bf16); A_log = log U(1, 16), dt_bias =
# softplus^-1 of a log-uniform dt in [1e-3, 1e-1] (fp32); pool N(0, 0.5^2) fp32; slot indices.
import torch
import torch.nn.functional as F

DTYPE = "bf16"
SOL = {
    "flops": 32 * 4 * 16 * (9 * 128 * 128 + 20),
    "bytes": 2 * (2 * 32 * 4 * 8 * 128 + 32 * 4 * 16 * 128 + 2 * 32 * 4 * 16) + 4 * 2 * 16 + 4 * 32
    + 2 * 4 * 32 * 16 * 128 * 128 + 2 * 32 * 4 * 16 * 128,
}

EPS = 1e-6


def _l2norm(x):
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + EPS)


def make_inputs(device="cuda", scale="full"):
    batch, steps, pool, hk, hv, d = (32, 4, 49, 8, 16, 128) if scale == "full" else (3, 4, 5, 2, 4, 16)
    q = torch.randn(batch, steps, hk, d, device=device).to(torch.bfloat16)
    k = torch.randn(batch, steps, hk, d, device=device).to(torch.bfloat16)
    v = torch.randn(batch, steps, hv, d, device=device).to(torch.bfloat16)
    a = torch.randn(batch, steps, hv, device=device).to(torch.bfloat16)
    b = torch.randn(batch, steps, hv, device=device).to(torch.bfloat16)
    a_log = torch.log(torch.empty(hv, device=device).uniform_(1, 16))
    dt = torch.exp(torch.empty(hv, device=device).uniform_(-6.9, -2.3))
    dt_bias = dt + torch.log(-torch.expm1(-dt))
    state_pool = 0.5 * torch.randn(pool, hv, d, d, device=device)
    state_indices = torch.randperm(pool, device=device)[:batch].to(torch.int32)
    return [q, k, v, a, b, a_log, dt_bias, state_pool, state_indices]


def reference(q, k, v, a, b, a_log, dt_bias, state_pool, state_indices):
    cdt = torch.promote_types(q.dtype, torch.float32)
    out_dtype = v.dtype
    hk, dk = q.shape[2:]
    hv = v.shape[2]
    alpha = torch.exp(-a_log.to(cdt).exp() * F.softplus(a.to(cdt) + dt_bias.to(cdt)))  # [B,T,Hv]
    beta = torch.sigmoid(b.to(cdt))
    q = _l2norm(q.to(cdt)).repeat_interleave(hv // hk, dim=2) * dk ** -0.5
    k = _l2norm(k.to(cdt)).repeat_interleave(hv // hk, dim=2)
    v = v.to(cdt)
    state = state_pool[state_indices.long()].to(cdt)  # [B,Hv,K,V]
    out = []
    for t in range(q.shape[1]):
        state = state * alpha[:, t, :, None, None]
        recalled = torch.einsum("bhkv,bhk->bhv", state, k[:, t])
        delta = (v[:, t] - recalled) * beta[:, t, :, None]
        state = state + k[:, t, :, :, None] * delta[:, :, None, :]
        out.append(torch.einsum("bhkv,bhk->bhv", state, q[:, t]))
    o = torch.stack(out, dim=1)
    return o.to(out_dtype), state.to(state_pool.dtype)
