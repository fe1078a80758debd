"""DeltaNet delta-rule linear attention over T=1024 from an fp32 initial state: L2-normalise q, k; v'_t = beta_t (v_t - S_{t-1}^T k_t), S_t = S_{t-1} + k_t v'_t^T, o_t = S_t^T q_t / sqrt(128), token by token; return (o bf16 [8, 16, 1024, 128], final state fp32 [8, 16, 128, 128])."""
# Source: DeltaNet (Yang et al., "Parallelizing Linear Transformers with the Delta Rule over
# Sequence Length", 2024): 1.3B configuration with 16 heads of 128 (key and value); q and k
# L2-normalised, beta in (0, 1) per token and head, q scaled by 1/sqrt(128). State S [K=128, V=128]
# per (batch, head), key index first; no decay.
# Original (MetaKernelBench p74, after flash-linear-attention's delta_rule_recurrence): the same
# inputs and outputs; q and k normalised with F.normalize semantics (x / max(||x||, 1e-12)).
# Reference: the token loop (the recurrence is the definition), each step vectorised over batch and
# heads, fp32 (fp64 in the anchor); o rounded to bf16, the final state returned in fp32.
# Layout: q, k, v [B, H, T, 128] bf16; beta [B, H, T] bf16; initial_state fp32 [B, H, 128, 128].
# Workload: B 8 x 16 heads x T 1024. Fixed: shapes.
# Redrawn per draw: q, k, v ~ N(0, 1); beta = sigmoid(N(0, 1)); initial_state ~ N(0, 1).
# Tolerance factor 6 (not 3): a valid fp32 evaluation of the same recurrence in another order
# (the chunked WY form) lands at ~2.4x the other form's own fp32 error on the final state.
import torch

DTYPE = "bf16"
SOL = {
    "flops": 6 * 8 * 16 * 1024 * 128 * 128,
    "bytes": 3 * 2 * 8 * 16 * 1024 * 128 + 2 * 8 * 16 * 1024 + 4 * 8 * 16 * 128 * 128
    + 2 * 8 * 16 * 1024 * 128 + 4 * 8 * 16 * 128 * 128,
}

TOLERANCE = {"factor": 6.0, "reason": "the fp32 final state after 1,024 sequential delta-rule steps: evaluating the recurrence in chunked (WY) form instead of token by token was measured at 2.4x the other form's own error (H200, full scale)"}


def make_inputs(device="cuda", scale="full"):
    batch, heads, seq, dk, dv = (8, 16, 1024, 128, 128) if scale == "full" else (2, 2, 128, 16, 16)
    bf = torch.bfloat16
    q = torch.randn(batch, heads, seq, dk, device=device, dtype=bf)
    k = torch.randn(batch, heads, seq, dk, device=device, dtype=bf)
    v = torch.randn(batch, heads, seq, dv, device=device, dtype=bf)
    beta = torch.randn(batch, heads, seq, device=device, dtype=bf).sigmoid()
    initial_state = torch.randn(batch, heads, dk, dv, device=device)
    return [q, k, v, beta, initial_state]


def _l2normalize(x):
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def reference(q, k, v, beta, initial_state):
    cdt, out_dtype = torch.promote_types(q.dtype, torch.float32), q.dtype
    q = _l2normalize(q.to(cdt)) * q.shape[-1] ** -0.5
    k = _l2normalize(k.to(cdt))
    v, beta = v.to(cdt), beta.to(cdt)
    state = initial_state.to(cdt)
    o = torch.empty_like(v)
    for t in range(q.shape[2]):
        k_t = k[:, :, t]
        delta = (v[:, :, t] - torch.einsum("bhk,bhkv->bhv", k_t, state)) * beta[:, :, t, None]
        state = state + k_t[..., None] * delta[:, :, None, :]
        o[:, :, t] = torch.einsum("bhk,bhkv->bhv", q[:, :, t], state)
    return o.to(out_dtype), state
