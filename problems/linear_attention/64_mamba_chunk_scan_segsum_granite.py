"""Mamba2 SSD chunked scan (segment-sum formulation): dt = softplus(dt + dt_bias), A = -exp(A_log), h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T, y_t = h_t C_t + D x_t, one B/C group shared by 16 heads of 64, state 128, chunk 256, zero initial state; returns bf16 y [B,T,16,64]."""
# Source: IBM Granite-4.0-H (granitemoehybrid) config.json: mamba_d_head 64, mamba_n_groups 1,
# mamba_d_state 128, mamba_chunk_size 256, mamba_d_conv 4; the Mamba2 layers use dt_softplus with
# a learned dt_bias, A = -exp(A_log) per head and a per-head skip D. We take 16 heads (a
# tensor-parallel slice). Slot change: the slot's state size 256 is not a Granite-4.0-H value;
# the published configs we checked (H-Tiny, H-1B and the 2048-wide dense hybrid) use 128.
# Workload: 8 sequences x 1024 tokens (4 chunks of 256).
# Semantics (state-space duality): per head, with a_t = dt_t * A and L[l, s] = exp(sum_{s<j<=l}
# a_j) for l >= s (the exponentiated segment sum): y = (C B^T * L) (dt x) within a chunk, plus the
# contribution of the chunk-entry state, carried across chunks; plus D x. Computed in fp32,
# rounded to bf16 once.
# Fixed: shapes. Redrawn per draw: x, B, C (N(0,1), bf16), dt (N(0,1), bf16), dt_bias =
# softplus^-1 of a log-uniform dt in [1e-3, 1e-1], A_log = log U(1, 16), D = 1 + 0.1 N(0,1) (fp32).
import torch
import torch.nn.functional as F

DTYPE = "bf16"
SOL = {
    "flops": 8 * 4 * (2 * 256 * 256 * 128 + 16 * 256 * 256 * (2 * 64 + 1))
    + 8 * 1024 * 16 * (4 * 64 * 128 + 4),
    "bytes": 2 * (8 * 1024 * 16 * 64 + 8 * 1024 * 16 + 2 * 8 * 1024 * 128) + 4 * 3 * 16
    + 2 * 8 * 1024 * 16 * 64,
}

CHUNK = 256


def _segsum(a):
    """a [..., L] -> [..., L, L]: sum of a over (s, l] for l >= s, -inf above the diagonal."""
    cs = a.cumsum(-1)
    out = cs[..., :, None] - cs[..., None, :]
    keep = torch.ones(a.shape[-1], a.shape[-1], dtype=torch.bool, device=a.device).tril()
    return out.masked_fill(~keep, float("-inf"))


def _ssd(x, dt, a, b, c, chunk):
    """x [B,T,H,P], dt [B,T,H], a = A per head [H], b, c [B,T,G,N] -> y [B,T,H,P] (no D term)."""
    bs, t, h, p = x.shape
    g, n = b.shape[2:]
    j, nc = h // g, t // chunk
    x = x.reshape(bs, nc, chunk, g, j, p)
    dt = dt.reshape(bs, nc, chunk, g, j)
    b, c = b.reshape(bs, nc, chunk, g, n), c.reshape(bs, nc, chunk, g, n)
    xdt = x * dt[..., None]
    adt = (dt * a.view(g, j)).permute(0, 3, 4, 1, 2)  # [B, G, J, nc, L]
    a_cs = adt.cumsum(-1)
    # intra-chunk (diagonal blocks)
    cb = torch.einsum("bclgn,bcsgn->bcgls", c, b)
    decay = _segsum(adt).exp().permute(0, 3, 1, 2, 4, 5)  # [B, nc, G, J, L, L]
    y = torch.einsum("bcgjls,bcsgjp->bclgjp", cb[:, :, :, None] * decay, xdt)
    # state at the end of every chunk from its own tokens, then carried across chunks
    to_end = (a_cs[..., -1:] - a_cs).exp().permute(0, 3, 4, 1, 2)[..., None]  # [B, nc, L, G, J, 1]
    states = torch.einsum("bclgn,bclgjp->bcgjpn", b, xdt * to_end)
    chunk_decay = a_cs[..., -1].exp().permute(0, 3, 1, 2)  # [B, nc, G, J]
    state = x.new_zeros(bs, g, j, p, n)
    entry = []
    for i in range(nc):
        entry.append(state)
        state = chunk_decay[:, i, :, :, None, None] * state + states[:, i]
    entry = torch.stack(entry, dim=1)  # state entering each chunk
    from_start = a_cs.exp().permute(0, 3, 4, 1, 2)[..., None]  # [B, nc, L, G, J, 1]
    y = y + torch.einsum("bclgn,bcgjpn->bclgjp", c, entry) * from_start
    return y.reshape(bs, t, h, p)


def make_inputs(device="cuda", scale="full"):
    batch, seq, heads, p, n = (8, 1024, 16, 64, 128) if scale == "full" else (2, 32, 4, 8, 16)
    x = torch.randn(batch, seq, heads, p, device=device).to(torch.bfloat16)
    dt = torch.randn(batch, seq, heads, device=device).to(torch.bfloat16)
    dt0 = torch.exp(torch.empty(heads, device=device).uniform_(-6.9, -2.3))
    dt_bias = dt0 + torch.log(-torch.expm1(-dt0))
    a_log = torch.log(torch.empty(heads, device=device).uniform_(1, 16))
    b = torch.randn(batch, seq, 1, n, device=device).to(torch.bfloat16)
    c = torch.randn(batch, seq, 1, n, device=device).to(torch.bfloat16)
    d = 1 + 0.1 * torch.randn(heads, device=device)
    return [x, dt, dt_bias, a_log, b, c, d]


def reference(x, dt, dt_bias, a_log, b, c, d):
    cdt = torch.promote_types(x.dtype, torch.float32)
    chunk = CHUNK if x.shape[1] % CHUNK == 0 else 8  # smoke sequences use chunks of 8
    xc = x.to(cdt)
    dtc = F.softplus(dt.to(cdt) + dt_bias.to(cdt))
    y = _ssd(xc, dtc, -a_log.to(cdt).exp(), b.to(cdt), c.to(cdt), chunk)
    return (y + d.to(cdt)[:, None] * xc).to(x.dtype)
