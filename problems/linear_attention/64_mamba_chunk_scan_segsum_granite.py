"""Mamba2 SSD chunked scan (segment-sum form) from a given initial state: per-step log-decays a [B,16,T] (dt*A, given), x [B,T,16,64] (already dt-scaled), one B/C group with state 256, chunk 256; y_t = C_t . h_t + D x_t with h_t = exp(a_t) h_{t-1} + x_t B_t^T; returns bf16 (y [B,T,16,64], final state [B,16,64,256])."""
# Source: IBM Granite-4.0-H (granitemoehybrid) Mamba2 layers: head dim 64, one B/C group
# (mamba_n_groups 1), chunk 256, a per-head skip D. Dims as the original gives them: 16 heads,
# state size 256.
# Original (MetaKernelBench p64): inputs (hidden_states [8, 1024, 16, 64], A [8, 16, 1024] ~
# U(-0.02, -0.0005), B and C [8, 1024, 1, 256], D [16], initial_states [8, 16, 64, 256]), all bf16;
# 2 outputs (y and the final state), no dt input (x and A arrive multiplied by dt).
# Semantics (state-space duality): per head, with L[l, s] = exp(sum_{s<j<=l} a_j) for l >= s (the
# exponentiated segment sum): within a chunk y = (C B^T * L) x, plus the contribution C_l .
# (exp(sum_{j<=l} a_j) h_entry) of the state entering the chunk, carried across chunks from the
# initial state; y += D x. Computed in fp32 (fp64 in the anchor), rounded to bf16 once.
# Workload: 8 sequences x 1024 tokens (4 chunks of 256). Fixed: shapes.
# Redrawn per draw: x, B, C, D, initial state (N(0,1)), a (U(-0.02, -0.0005)), all bf16.
import torch

DTYPE = "bf16"
SOL = {
    "flops": 8 * 4 * (2 * 256 * 256 * 256 + 16 * 256 * 256 * (2 * 64 + 1)) + 8 * 1024 * 16 * (4 * 64 * 256 + 4),
    "bytes": 2 * (8 * 1024 * 16 * 64 + 8 * 16 * 1024 + 2 * 8 * 1024 * 256 + 16 + 8 * 16 * 64 * 256)
    + 2 * (8 * 1024 * 16 * 64 + 8 * 16 * 64 * 256),
}

CHUNK = 256


def _segsum(a):
    """a [..., L] -> [..., L, L]: sum of a over (s, l] for l >= s, -inf above the diagonal."""
    cs = a.cumsum(-1)
    out = cs[..., :, None] - cs[..., None, :]
    keep = torch.ones(a.shape[-1], a.shape[-1], dtype=torch.bool, device=a.device).tril()
    return out.masked_fill(~keep, float("-inf"))


def _ssd(x, a, b, c, state, chunk):
    """x [B,T,H,P], a [B,H,T], b, c [B,T,G,N], state [B,H,P,N] -> (y [B,T,H,P], final state)."""
    bs, t, h, p = x.shape
    g, n = b.shape[2:]
    j, nc = h // g, t // chunk
    x = x.reshape(bs, nc, chunk, g, j, p)
    b, c = b.reshape(bs, nc, chunk, g, n), c.reshape(bs, nc, chunk, g, n)
    a = a.reshape(bs, g, j, nc, chunk)
    a_cs = a.cumsum(-1)
    cb = torch.einsum("bclgn,bcsgn->bcgls", c, b)
    decay = _segsum(a).exp().permute(0, 3, 1, 2, 4, 5)                      # [B, nc, G, J, L, L]
    y = torch.einsum("bcgjls,bcsgjp->bclgjp", cb[:, :, :, None] * decay, x)
    to_end = (a_cs[..., -1:] - a_cs).exp().permute(0, 3, 4, 1, 2)[..., None]  # [B, nc, L, G, J, 1]
    own = torch.einsum("bclgn,bclgjp->bcgjpn", b, x * to_end)
    chunk_decay = a_cs[..., -1].exp().permute(0, 3, 1, 2)                  # [B, nc, G, J]
    state = state.reshape(bs, g, j, p, n)
    entry = []
    for i in range(nc):
        entry.append(state)
        state = chunk_decay[:, i, :, :, None, None] * state + own[:, i]
    from_start = a_cs.exp().permute(0, 3, 4, 1, 2)[..., None]              # [B, nc, L, G, J, 1]
    y = y + torch.einsum("bclgn,bcgjpn->bclgjp", c, torch.stack(entry, dim=1)) * from_start
    return y.reshape(bs, t, h, p), state.reshape(bs, h, p, n)


def make_inputs(device="cuda", scale="full"):
    batch, seq, heads, p, n = (8, 1024, 16, 64, 256) if scale == "full" else (2, 32, 4, 8, 16)
    bf = torch.bfloat16
    x = torch.randn(batch, seq, heads, p, device=device, dtype=bf)
    a = torch.empty(batch, heads, seq, device=device, dtype=bf).uniform_(-0.02, -0.0005)
    b = torch.randn(batch, seq, 1, n, device=device, dtype=bf)
    c = torch.randn(batch, seq, 1, n, device=device, dtype=bf)
    d = torch.randn(heads, device=device, dtype=bf)
    initial_state = torch.randn(batch, heads, p, n, device=device, dtype=bf)
    return [x, a, b, c, d, initial_state]


def reference(x, a, b, c, d, initial_state):
    cdt = torch.promote_types(x.dtype, torch.float32)
    chunk = CHUNK if x.shape[1] % CHUNK == 0 else 8  # smoke sequences use chunks of 8
    xc = x.to(cdt)
    y, state = _ssd(xc, a.to(cdt), b.to(cdt), c.to(cdt), initial_state.to(cdt), chunk)
    return (y + d.to(cdt)[:, None] * xc).to(x.dtype), state.to(x.dtype)
