"""Variable-length gated delta rule prefill over 4 packed sequences (cu_seqlens) from per-sequence fp32 states stored [V, K]: decay alpha = exp(-exp(A_log) * softplus(a + dt_bias)), beta = sigmoid(b), q/k given L2-normalised, 8 q/k heads shared by 16 v heads, token-by-token; returns (o bf16 [959,16,128], new states fp32 [4,16,128,128] in [V, K] layout)."""
# Source: Qwen3-Next-80B-A3B at tensor parallel 2 (8 q/k heads, 16 v heads of 128; v head h reads
# q/k head h // 2); the gated delta rule with per-head decay from A_log, dt_bias and the gate
# projection a, and beta = sigmoid(b).
# Original (MetaKernelBench p71, FlashInfer-Trace gdn_prefill_qk8_v16_d128_k_last): inputs (q, k
# [959, 8, 128] drawn L2-normalised, v [959, 16, 128], state fp32 [4, 16, 128, 128] stored with the
# key dim last, A_log, a, dt_bias, b, cu_seqlens int64 (0, 19, 50, 940, 959), scale); the captured
# A_log and dt_bias values below; 2 outputs.
# Recurrence per sequence and v head, with S = state^T [K, V]: S' = alpha S; u = k^T S' (recalled);
# S = S' + k (beta v + (1 - beta) u - u)^T; o = scale * q^T S (rounded to bf16 per token); the final
# S is stored back transposed.
# Reference: token loop per sequence, vectorised over heads, fp32 (fp64 in the anchor).
# Fixed: shapes, sequence boundaries, A_log, dt_bias, scale. Redrawn per draw (at the capture's
# scales): q, k (normalised N(0,1), bf16); v (0.041 N, bf16); state (N(0, 1/128), fp32);
# a (-0.12 + 1.26 N, bf16); b (1.47 + 2.01 N, bf16).
import torch
import torch.nn.functional as F

DTYPE = "bf16"
SOL = {
    "flops": 16 * 959 * 8 * 128 * 128,
    "bytes": 2 * (2 * 959 * 8 * 128 + 959 * 16 * 128 + 2 * 959 * 16) + 4 * 2 * 16 + 8 * 5
    + 2 * 4 * 4 * 16 * 128 * 128 + 2 * 959 * 16 * 128,
}

CU_SEQLENS = (0, 19, 50, 940, 959)
A_LOG = (1.3984375, 1.203125, 2.203125, 0.1474609375, 1.46875, -0.6171875, 1.8125, -1.359375, 0.50390625, 1.03125,
         2.953125, 1.2890625, 1.3203125, 2.109375, 3.34375, 1.78125)
DT_BIAS = (-2.34375, -3.421875, -4.03125, -1.65625, -3.25, 2.046875, -5.625, -2.65625, -2.375, -2.984375, -2.328125,
           -4.09375, -4.25, -3.71875, -4.96875, -3.578125)
SCALE = 0.08838834764831843


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        cu, hk, hv, d, a_log, dt_bias = CU_SEQLENS, 8, 16, 128, A_LOG, DT_BIAS
    else:
        cu, hk, hv, d, a_log, dt_bias = (0, 3, 8, 29, 32), 2, 4, 16, A_LOG[:4], DT_BIAS[:4]
    total, bf = cu[-1], torch.bfloat16
    q = F.normalize(torch.randn(total, hk, d, device=device), p=2, dim=-1).to(bf)
    k = F.normalize(torch.randn(total, hk, d, device=device), p=2, dim=-1).to(bf)
    v = 0.041 * torch.randn(total, hv, d, device=device, dtype=bf)
    state = d ** -0.5 * torch.randn(len(cu) - 1, hv, d, d, device=device)
    a = (-0.12 + 1.26 * torch.randn(total, hv, device=device)).to(bf)
    b = (1.47 + 2.01 * torch.randn(total, hv, device=device)).to(bf)
    return [q, k, v, state, torch.tensor(a_log, device=device), a, torch.tensor(dt_bias, device=device), b,
            torch.tensor(cu, dtype=torch.int64, device=device), SCALE]


def reference(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale):
    cdt = torch.promote_types(q.dtype, torch.float32)
    hv = v.shape[1]
    alpha = torch.exp(-torch.exp(A_log.to(cdt)) * F.softplus(a.to(cdt) + dt_bias.to(cdt)))  # [T, Hv]
    beta = torch.sigmoid(b.to(cdt))
    qh = q.to(cdt).repeat_interleave(hv // q.shape[1], dim=1)
    kh = k.to(cdt).repeat_interleave(hv // k.shape[1], dim=1)
    vh = v.to(cdt)
    out = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    new_state = torch.empty(state.shape, dtype=cdt, device=q.device)
    bounds = cu_seqlens.tolist()
    for n, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        s = state[n].to(cdt).transpose(-1, -2)                          # [Hv, K, V]
        for t in range(start, end):
            s = alpha[t, :, None, None] * s
            recalled = torch.einsum("hk,hkv->hv", kh[t], s)
            target = beta[t, :, None] * vh[t] + (1 - beta[t, :, None]) * recalled
            s = s + kh[t, :, :, None] * (target - recalled)[:, None, :]
            out[t] = (scale * torch.einsum("hk,hkv->hv", qh[t], s)).to(q.dtype)
        new_state[n] = s.transpose(-1, -2)
    return out, new_state
