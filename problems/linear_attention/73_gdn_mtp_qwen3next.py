"""Gated delta rule multi-token (MTP draft verification) step over a pooled fp32 state stored [V, K]: each of 32 requests reads its state from the pool by index and runs 4 draft tokens (decay from A_log/a/dt_bias, beta = sigmoid(b), q and k used as given, 8 q/k heads shared by 16 v heads); returns (o bf16 [32,4,16,128], an unchanged copy of the pool fp32 [49,16,128,128], as the original returns it)."""
# Source: Qwen3-Next-80B-A3B at tensor parallel 2 (8 q/k heads, 16 v heads of 128; v head h reads
# q/k head h // 2); its multi-token-prediction drafts are verified by running several tokens per
# request through every layer in one step.
# Original (MetaKernelBench p73, FlashInfer-Trace gdn_mtp_qk8_v16_d128_k_last): inputs (q, k
# [32, 4, 8, 128], v [32, 4, 16, 128], initial_state pool fp32 [49, 16, 128, 128] with the key dim
# last, initial_state_indices int32 [32] (distinct slots), A_log, a, dt_bias, b [32, 4, 16],
# scale); the captured A_log and dt_bias values below. Its second output is an unchanged copy of the
# pool (a draft verification commits no state until the drafts are accepted), and so is ours: until
# 2026-12-07 ours held each request's final state in its slot, which the original does not.
# Per (request, token, v head), with S = pool[index]^T [K, V]: S' = alpha S; u = k^T S';
# S = S' + k (beta v + (1 - beta) u - u)^T; o = scale * q^T S.
# Reference: a loop over (request, token, head), as the original evaluates it, fp32 (fp64 in the
# anchor).
# Fixed: shapes, A_log, dt_bias, scale. Redrawn per draw (at the capture's scales): q (0.63 N),
# k (0.26 N), v (0.13 N) (each drawn N(0,1) in bf16 and scaled in bf16, as the original), a (0.82 + 2.24 N),
# b (0.45 + 2.02 N), all bf16; pool 0.0215 N (fp32);
# the 32 slot indices (the first 32 of a random permutation of the 49 slots).
import torch
import torch.nn.functional as F

DTYPE = "bf16"
SOL = {
    "flops": 6 * 32 * 4 * 16 * 128 * 128,
    "bytes": 2 * (2 * 32 * 4 * 8 * 128 + 32 * 4 * 16 * 128 + 2 * 32 * 4 * 16) + 4 * 2 * 16 + 4 * 32
    + 2 * 4 * 49 * 16 * 128 * 128 + 2 * 32 * 4 * 16 * 128,
}

A_LOG = (-1.046875, -0.5234375, -1.828125, -1.15625, -0.0244140625, 0.28515625, -1.9921875, -2.0, 0.11962890625,
         0.3671875, -1.59375, -1.34375, 0.333984375, -1.640625, -0.5234375, -0.2890625)
DT_BIAS = (-5.25, -5.75, -2.015625, -3.3125, -6.25, -6.65625, -0.88671875, -0.6328125, -4.8125, -5.28125, -1.7578125,
           -3.484375, 2.3125, -6.40625, -6.34375, -6.75)
SCALE = 0.08838834764831843


def make_inputs(device="cuda", scale="full"):
    batch, steps, pool, hk, hv, d = (32, 4, 49, 8, 16, 128) if scale == "full" else (3, 4, 5, 2, 4, 16)
    bf = torch.bfloat16
    q = 0.63 * torch.randn(batch, steps, hk, d, device=device, dtype=bf)
    k = 0.26 * torch.randn(batch, steps, hk, d, device=device, dtype=bf)
    v = 0.13 * torch.randn(batch, steps, hv, d, device=device, dtype=bf)
    state_pool = 0.0215 * torch.randn(pool, hv, d, d, device=device)
    indices = torch.randperm(pool, device=device)[:batch].to(torch.int32)
    a = (0.82 + 2.24 * torch.randn(batch, steps, hv, device=device)).to(bf)
    b = (0.45 + 2.02 * torch.randn(batch, steps, hv, device=device)).to(bf)
    return [q, k, v, state_pool, indices, torch.tensor(A_LOG[:hv], device=device), a,
            torch.tensor(DT_BIAS[:hv], device=device), b, SCALE]


def reference(q, k, v, state_pool, indices, A_log, a, dt_bias, b, scale):
    cdt = torch.promote_types(q.dtype, torch.float32)
    batch, steps, hk, _ = q.shape
    hv = v.shape[2]
    alpha = torch.exp(-torch.exp(A_log.to(cdt)) * F.softplus(a.to(cdt) + dt_bias.to(cdt)))  # [B, T, Hv]
    beta = torch.sigmoid(b.to(cdt))
    qh = q.to(cdt).repeat_interleave(hv // hk, dim=2)
    kh = k.to(cdt).repeat_interleave(hv // hk, dim=2)
    vh = v.to(cdt)
    out = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    pool = state_pool.to(cdt, copy=True)
    for i in range(batch):
        s = pool[int(indices[i])].transpose(-1, -2).clone()             # [Hv, K, V]
        for t in range(steps):
            for h in range(hv):
                sh = alpha[i, t, h] * s[h]
                recalled = kh[i, t, h] @ sh
                target = beta[i, t, h] * vh[i, t, h] + (1 - beta[i, t, h]) * recalled
                s[h] = sh + kh[i, t, h, :, None] * (target - recalled)[None, :]
                out[i, t, h] = (scale * (qh[i, t, h] @ s[h])).to(q.dtype)
    return out, pool
