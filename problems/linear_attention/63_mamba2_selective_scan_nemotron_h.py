"""Whole Mamba2 mixer layer: in_proj to [z | xBC | dt], causal depthwise conv (width 4) + SiLU on xBC, SSD selective scan (256 heads of 64, 8 B/C groups, state 256, chunk 128, dt = clamp(softplus(dt + dt_bias), given limits), A = -exp(A_log), skip D), gated group RMSNorm (y * silu(z), 8 groups, eps given), out_proj; bf16 hidden [B,S,8192] in and out."""
# Source: Nemotron-H-56B (NVIDIA; config facts: hidden_size 8192, mamba_num_heads 256,
# mamba_head_dim 64, ssm_state_size 256, n_groups 8, conv_kernel 4, chunk_size 128,
# layer_norm_epsilon 1e-5, use_bias false, use_conv_bias true). Its Mamba2 mixer: in_proj 8192 ->
# z (16384) | xBC (16384 + 2 * 8 * 256 = 20480) | dt (256); causal depthwise conv1d over xBC with
# bias, then SiLU; split xBC into x | B | C; head h uses B/C group h // 32; selective scan with
# D skip; y = RMSNorm_grouped(y * silu(z)) * norm_weight with 8 groups of 2048 channels
# (norm_before_gate false); out_proj 16384 -> 8192.
# Original (MetaKernelBench p63): inputs (hidden_states, in_proj, conv1d weight and bias, dt_bias,
# A_log, D, norm weight, out_proj, time_step_limit (0.0, 1e6), layer_norm_epsilon 1e-5), all tensors
# bf16; 12 inputs, 1 output.
# Workload: 8 sequences x 512 tokens (4 chunks of 128), zero initial conv and SSM states.
# Semantics: computed in fp32 (GEMMs included), rounded to bf16 once at the end.
# Fixed: shapes, limits, eps. Redrawn per draw (all bf16, as the original draws them): hidden
# (N(0,1)), in_proj / out_proj (N(0, 1/fan_in)), conv weight (N(0, 1/4)) and bias (N(0,1)), dt_bias
# (N(0,1)), A_log (U(-5, -1)), D (N(0,1)), norm weight (1 + 0.1 N).
import torch
import torch.nn.functional as F

DTYPE = "bf16"
SOL = {
    "flops": 2 * 4096 * 8192 * 37120 + 2 * 4096 * 16384 * 8192 + 2 * 4 * 4096 * 20480
    + 8 * 4 * (8 * 2 * 128 * 128 * 256 + 256 * 128 * 128 * (2 * 64 + 1)) + 4096 * 256 * 6 * 64 * 256
    + 10 * 4096 * 16384,
    "bytes": 2 * 4096 * 8192 + 2 * 37120 * 8192 + 2 * 20480 * 5 + 2 * 3 * 256 + 2 * 16384
    + 2 * 8192 * 16384 + 2 * 4096 * 8192,
}

CHUNK, EPS, WIDTH = 128, 1e-5, 4
TIME_STEP_MIN, TIME_STEP_MAX = 0.0, 1000000.0


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
    if scale == "full":
        batch, seq, hidden, heads, p, groups, n = 8, 512, 8192, 256, 64, 8, 256
    else:
        batch, seq, hidden, heads, p, groups, n = 2, 32, 64, 8, 8, 2, 16
    d_inner, conv_dim = heads * p, heads * p + 2 * groups * n
    bf = torch.bfloat16
    hidden_states = torch.randn(batch, seq, hidden, device=device).to(bf)
    w_in = (torch.randn(d_inner + conv_dim + heads, hidden, device=device) / hidden ** 0.5).to(bf)
    conv_w = (torch.randn(conv_dim, 1, WIDTH, device=device) / WIDTH ** 0.5).to(bf)
    conv_b = torch.randn(conv_dim, device=device, dtype=bf)
    dt_bias = torch.randn(heads, device=device, dtype=bf)
    a_log = torch.empty(heads, device=device, dtype=bf).uniform_(-5.0, -1.0)
    d = torch.randn(heads, device=device, dtype=bf)
    norm_w = (1 + 0.1 * torch.randn(d_inner, device=device)).to(bf)
    w_out = (torch.randn(hidden, d_inner, device=device) / d_inner ** 0.5).to(bf)
    return [hidden_states, w_in, conv_w, conv_b, dt_bias, a_log, d, norm_w, w_out, TIME_STEP_MIN, TIME_STEP_MAX, EPS]


def reference(hidden_states, w_in, conv_w, conv_b, dt_bias, a_log, d, norm_w, w_out, time_step_min, time_step_max, eps):
    cdt = torch.promote_types(hidden_states.dtype, torch.float32)
    bs, t, _ = hidden_states.shape
    heads = a_log.numel()
    d_inner = norm_w.numel()
    p = d_inner // heads
    groups = 8 if heads == 256 else 2  # smoke shapes use 2 groups
    n = (conv_w.shape[0] - d_inner) // (2 * groups)
    chunk = CHUNK if t % CHUNK == 0 else 8  # smoke sequences use chunks of 8
    zxbcdt = hidden_states.to(cdt) @ w_in.to(cdt).T
    z, xbc, dt = zxbcdt.split([d_inner, d_inner + 2 * groups * n, heads], dim=-1)
    xbc = F.conv1d(xbc.transpose(1, 2), conv_w.to(cdt), conv_b.to(cdt), padding=WIDTH - 1,
                   groups=xbc.shape[-1])[..., :t]
    xbc = F.silu(xbc.transpose(1, 2))
    x, b, c = xbc.split([d_inner, groups * n, groups * n], dim=-1)
    x = x.reshape(bs, t, heads, p)
    dt = F.softplus(dt + dt_bias.to(cdt)).clamp(time_step_min, time_step_max)
    y = _ssd(x, dt, -a_log.to(cdt).exp(), b.reshape(bs, t, groups, n), c.reshape(bs, t, groups, n), chunk)
    y = (y + d.to(cdt)[:, None] * x).reshape(bs, t, d_inner) * F.silu(z)
    y = y.reshape(bs, t, groups, -1)
    y = (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)).reshape(bs, t, d_inner) * norm_w.to(cdt)
    return (y @ w_out.to(cdt).T).to(hidden_states.dtype)
