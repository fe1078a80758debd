"""Gated delta rule decode step (one token per sequence) on fp32 states stored [V, K]: decay alpha = exp(-exp(A_log) * softplus(a + dt_bias)), beta = sigmoid(b), 8 q/k heads shared by 16 v heads, q and k used as given, o = scale * q . S; returns (o bf16 [64,1,16,128], new state fp32 [64,16,128,128] in [V, K] layout)."""
# Source: Qwen3-Next-80B-A3B at tensor parallel 2 (8 q/k heads, 16 v heads of 128; v head h reads
# q/k head h // 2).
# Original (MetaKernelBench p72, FlashInfer-Trace gdn_decode_qk8_v16_d128_k_last): inputs (q, k
# [64, 1, 8, 128], v [64, 1, 16, 128], state fp32 [64, 16, 128, 128] with the key dim last, A_log,
# a [64, 1, 16], dt_bias, b [64, 1, 16], scale); the captured A_log and dt_bias values below; no
# L2 normalisation inside; 2 outputs.
# Per (sequence, v head), with S = state^T [K, V]: S' = alpha S; u = k^T S'; S = S' + k (beta v +
# (1 - beta) u - u)^T; o = scale * q^T S; the new state is stored transposed.
# Reference: a loop over the 64 x 16 (sequence, head) pairs, as the original evaluates it, fp32
# (fp64 in the anchor).
# Fixed: shapes, A_log, dt_bias, scale. Redrawn per draw (at the capture's scales): q (0.18 N),
# k (0.13 N), v (0.073 N) (each drawn N(0,1) in bf16 and scaled in bf16, as the original), a (1.33 + 1.56 N),
# b (0.4 + 1.38 N), all bf16; state 0.009 N (fp32).
import torch
import torch.nn.functional as F

DTYPE = "bf16"
SOL = {
    "flops": 6 * 64 * 16 * 128 * 128,
    "bytes": 2 * 4 * 64 * 16 * 128 * 128 + 2 * 2 * 64 * 8 * 128 + 2 * 64 * 16 * 128 + 2 * 2 * 64 * 16
    + 2 * 4 * 16 + 2 * 64 * 16 * 128,
}

A_LOG = (-0.169921875, 2.34375, 1.3359375, 2.1875, -0.9375, -1.09375, 1.765625, -0.443359375, 0.91015625, -0.8125,
         2.328125, 0.205078125, 1.375, 2.796875, -0.88671875, -1.3046875)
DT_BIAS = (-2.078125, -5.625, -4.3125, -3.421875, -3.796875, -3.296875, -4.375, -6.25, -3.703125, -0.2890625,
           -5.21875, -6.1875, -3.046875, -5.0625, -4.875, -5.34375)
SCALE = 0.08838834764831843


def make_inputs(device="cuda", scale="full"):
    batch, hk, hv, d = (64, 8, 16, 128) if scale == "full" else (3, 2, 4, 16)
    bf = torch.bfloat16
    q = 0.18 * torch.randn(batch, 1, hk, d, device=device, dtype=bf)
    k = 0.13 * torch.randn(batch, 1, hk, d, device=device, dtype=bf)
    v = 0.073 * torch.randn(batch, 1, hv, d, device=device, dtype=bf)
    state = 0.009 * torch.randn(batch, hv, d, d, device=device)
    a = (1.33 + 1.56 * torch.randn(batch, 1, hv, device=device)).to(bf)
    b = (0.4 + 1.38 * torch.randn(batch, 1, hv, device=device)).to(bf)
    return [q, k, v, state, torch.tensor(A_LOG[:hv], device=device), a, torch.tensor(DT_BIAS[:hv], device=device), b,
            SCALE]


def reference(q, k, v, state, A_log, a, dt_bias, b, scale):
    cdt = torch.promote_types(q.dtype, torch.float32)
    batch, _, hk, _ = q.shape
    hv = v.shape[2]
    alpha = torch.exp(-torch.exp(A_log.to(cdt)) * F.softplus(a[:, 0].to(cdt) + dt_bias.to(cdt)))  # [B, Hv]
    beta = torch.sigmoid(b[:, 0].to(cdt))
    qh = q[:, 0].to(cdt).repeat_interleave(hv // hk, dim=1)
    kh = k[:, 0].to(cdt).repeat_interleave(hv // hk, dim=1)
    vh = v[:, 0].to(cdt)
    out = torch.empty(batch, hv, v.shape[-1], dtype=cdt, device=q.device)
    new_state = torch.empty(state.shape, dtype=cdt, device=q.device)
    for i in range(batch):
        for h in range(hv):
            s = alpha[i, h] * state[i, h].to(cdt).T
            recalled = kh[i, h] @ s
            target = beta[i, h] * vh[i, h] + (1 - beta[i, h]) * recalled
            s = s + kh[i, h, :, None] * (target - recalled)[None, :]
            out[i, h] = scale * (qh[i, h] @ s)
            new_state[i, h] = s.T
    return out[:, None].to(q.dtype), new_state
