"""Chunked gated delta rule (Gated DeltaNet prefill, chunk 64) from a zero state: in-kernel L2 norm of q and k, 4 q/k heads shared by 16 v heads (head-first [B, H, T, 128] layout), bf16 log-decay g and beta, q scale given; returns bf16 o [B,16,T,128]."""
# Source: Qwen3-Next-80B-A3B Gated DeltaNet layers (L2-normalised q and k, q scaled by 128^-0.5,
# each q/k head shared by consecutive v heads: v head h reads q/k head h // 4 here).
# Original (MetaKernelBench p62): inputs (q, k [16, 4, 256, 128], v [16, 16, 256, 128], g
# [16, 16, 256] ~ U(-0.05, 0), beta [16, 16, 256] = sigmoid(N(0,1)), scale 0.08838834764831845),
# all bf16 but the scale; one output; chunk 64, no initial or final state.
# Recurrence per v head (S is [K, V], alpha_t = exp(g_t)), with q and k L2-normalised (eps 1e-6):
#   S_t = alpha_t S_{t-1} + beta_t k_t (v_t - alpha_t S_{t-1}^T k_t)^T,   o_t = scale * S_t^T q_t.
# Reference algorithm: chunks of 64 with the WY / UT transform (exact up to rounding), all in fp32
# (fp64 in the anchor), output rounded to bf16 once.
# Workload: 16 sequences x 256 tokens. Fixed: shapes, chunk size, scale.
# Redrawn per draw: q, k, v (N(0,1)), g (U(-0.05, 0)), beta (sigmoid(N(0,1))), all bf16.
import torch

DTYPE = "bf16"
SOL = {
    "flops": 16 * 16 * 256 * (8 * 128 * 128 + 4 * 64 * 128 + 2 * 64 * 64),
    "bytes": 2 * (2 * 16 * 4 * 256 * 128 + 16 * 16 * 256 * 128 + 2 * 16 * 16 * 256) + 2 * 16 * 16 * 256 * 128,
}

CHUNK, EPS = 64, 1e-6
SCALE = 0.08838834764831845


def _l2norm(x):
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + EPS)


def _chunked(q, k, v, g, beta, chunk):
    """q, k [B,H,T,K]; v [B,H,T,V]; g, beta [B,H,T]; zero initial state; T a multiple of chunk -> o [B,H,T,V]."""
    b, h, t, dk = k.shape
    n = t // chunk
    q, k, v = (x.reshape(b, h, n, chunk, x.shape[-1]) for x in (q, k, v))
    g, beta = g.reshape(b, h, n, chunk), beta.reshape(b, h, n, chunk)
    gam = g.cumsum(-1)
    diff = gam[..., :, None] - gam[..., None, :]
    ones = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device)
    decay_strict = diff.masked_fill(~ones.tril(-1), float("-inf")).exp()
    decay_incl = diff.masked_fill(~ones.tril(), float("-inf")).exp()
    eye = torch.eye(chunk, dtype=q.dtype, device=q.device)
    a_kk = beta[..., None] * (k @ k.transpose(-1, -2)) * decay_strict
    t_inv = torch.linalg.solve_triangular(eye + a_kk, eye.expand_as(a_kk), upper=False, unitriangular=True)
    w = t_inv @ (k * (beta * gam.exp())[..., None])
    u = t_inv @ (v * beta[..., None])
    a_qk = (q @ k.transpose(-1, -2)) * decay_incl
    state = q.new_zeros(b, h, dk, v.shape[-1])
    o = torch.empty_like(v)
    for i in range(n):
        v_new = u[:, :, i] - w[:, :, i] @ state
        o[:, :, i] = gam[:, :, i, :, None].exp() * (q[:, :, i] @ state) + a_qk[:, :, i] @ v_new
        last = gam[:, :, i, -1]
        tail = v_new * (last[..., None] - gam[:, :, i]).exp()[..., None]
        state = last.exp()[..., None, None] * state + k[:, :, i].transpose(-1, -2) @ tail
    return o.reshape(b, h, t, -1)


def make_inputs(device="cuda", scale="full"):
    batch, seq, hk, hv, d = (16, 256, 4, 16, 128) if scale == "full" else (2, 24, 1, 4, 16)
    bf = torch.bfloat16
    q = torch.randn(batch, hk, seq, d, device=device, dtype=bf)
    k = torch.randn(batch, hk, seq, d, device=device, dtype=bf)
    v = torch.randn(batch, hv, seq, d, device=device, dtype=bf)
    g = torch.empty(batch, hv, seq, device=device, dtype=bf).uniform_(-0.05, 0.0)
    beta = torch.randn(batch, hv, seq, device=device, dtype=bf).sigmoid()
    return [q, k, v, g, beta, SCALE]


def reference(q, k, v, g, beta, scale):
    cdt = torch.promote_types(q.dtype, torch.float32)
    hv = v.shape[1]
    chunk = CHUNK if q.shape[2] % CHUNK == 0 else 8  # smoke sequences (24 tokens) use chunks of 8

    def heads(x):  # normalised and repeated to the v heads
        return _l2norm(x.to(cdt)).repeat_interleave(hv // x.shape[1], dim=1)

    o = _chunked(heads(q) * scale, heads(k), v.to(cdt), g.to(cdt), beta.to(cdt), chunk)
    return o.to(v.dtype)
