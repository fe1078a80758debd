"""DeltaNet delta-rule linear attention over T=1024 from an fp32 initial state: L2-normalise q, k; S_t = S_{t-1} + k_t (beta_t (v_t - S_{t-1}^T k_t))^T, o_t = S_t^T q_t / sqrt(128); return (o bf16 [8, 16, 1024, 128], final state fp32 [8, 16, 128, 128])."""
# Source: DeltaNet (Yang et al., "Parallelizing Linear Transformers with the Delta Rule over
# Sequence Length", 2024): 1.3B configuration with hidden 2048 = 16 heads x 128 (key and value head
# dim 128); q and k L2-normalised (eps 1e-6), beta in (0, 1) per token and head, q scaled by
# 1/sqrt(128). State S [K=128, V=128] per (batch, head), key index first; no decay.
# The reference evaluates the exact recurrence in chunks of 64 tokens (the WY / UT-transform form:
# per chunk U = (I + strict_tril(diag(beta) K K^T))^-1 diag(beta) (V - K S), O = Q S +
# tril(Q K^T) U, S <- S + K^T U), which equals the token-by-token recurrence up to rounding.
# Layout: q, k, v [B, H, T, 128] bf16; beta [B, H, T] bf16; initial_state fp32 [B, H, 128, 128].
# All math in fp32; o rounded to bf16, the final state returned in fp32.
# Workload: B 8 x 16 heads x T 1024. Fixed: shapes.
# Redrawn per draw: q, k, v ~ N(0, 1); beta = sigmoid(N(0, 1)); initial_state ~ N(0, 1).
# Tolerance factor 6 (not 3): a valid fp32 evaluation of the same recurrence in another order
# (token by token) lands at ~2.4x the reference's own fp32 error on the final state.
import torch

DTYPE = "bf16"
SOL = {
    "flops": 6 * 8 * 16 * 1024 * 128 * 128,
    "bytes": 3 * 2 * 8 * 16 * 1024 * 128 + 2 * 8 * 16 * 1024 + 4 * 8 * 16 * 128 * 128
    + 2 * 8 * 16 * 1024 * 128 + 4 * 8 * 16 * 128 * 128,
}

TOLERANCE = {"factor": 6.0, "reason": "the fp32 final state after 1,024 sequential delta-rule steps: a token-by-token fp32 recurrence was measured at 2.4x the chunked reference's own error (H200, full scale)"}

CHUNK = 64
L2_EPS = 1e-6


def make_inputs(device="cuda", scale="full"):
    batch, heads, seq, dk, dv = (8, 16, 1024, 128, 128) if scale == "full" else (2, 2, 128, 16, 16)
    q = torch.randn(batch, heads, seq, dk, device=device).to(torch.bfloat16)
    k = torch.randn(batch, heads, seq, dk, device=device).to(torch.bfloat16)
    v = torch.randn(batch, heads, seq, dv, device=device).to(torch.bfloat16)
    beta = torch.sigmoid(torch.randn(batch, heads, seq, device=device)).to(torch.bfloat16)
    initial_state = torch.randn(batch, heads, dk, dv, device=device)
    return [q, k, v, beta, initial_state]


def _l2norm(x):
    return x * torch.rsqrt(x.pow(2).sum(dim=-1, keepdim=True) + L2_EPS)


def reference(q, k, v, beta, initial_state):
    compute = torch.promote_types(q.dtype, torch.float32)
    batch, heads, seq, dk = q.shape
    dv = v.shape[-1]
    chunks = seq // CHUNK
    qc = (_l2norm(q.to(compute)) * dk ** -0.5).view(batch, heads, chunks, CHUNK, dk)
    kc = _l2norm(k.to(compute)).view(batch, heads, chunks, CHUNK, dk)
    vc = v.to(compute).view(batch, heads, chunks, CHUNK, dv)
    bc = beta.to(compute).view(batch, heads, chunks, CHUNK, 1)
    lower = torch.tril(bc * (kc @ kc.transpose(-1, -2)), diagonal=-1)
    eye = torch.eye(CHUNK, dtype=compute, device=q.device)
    w = torch.linalg.solve_triangular(eye + lower, bc * kc, upper=False, unitriangular=True)
    u0 = torch.linalg.solve_triangular(eye + lower, bc * vc, upper=False, unitriangular=True)
    scores = torch.tril(qc @ kc.transpose(-1, -2))
    state = initial_state.to(compute)
    out = torch.empty(batch, heads, chunks, CHUNK, dv, dtype=compute, device=q.device)
    for n in range(chunks):
        u = u0[:, :, n] - w[:, :, n] @ state
        out[:, :, n] = qc[:, :, n] @ state + scores[:, :, n] @ u
        state = state + kc[:, :, n].transpose(-1, -2) @ u
    return out.view(batch, heads, seq, dv).to(q.dtype), state.to(initial_state.dtype)
