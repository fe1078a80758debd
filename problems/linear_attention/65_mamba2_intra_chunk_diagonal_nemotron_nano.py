"""Mamba2 SSD intra-chunk (diagonal block) output for one 128-token chunk: y[l] = sum_{s<=l} (C_l . B_s) exp(sum_{s<j<=l} dt_j A) dt_s x_s, 64 heads of 64 in 8 B/C groups, state 128; x/B/C bf16, dt/A fp32 in, bf16 y [B,128,64,64] out."""
# Source: NVIDIA-Nemotron-3-Nano-30B-A3B config.json: mamba_num_heads 64, mamba_head_dim 64,
# ssm_state_size 128, n_groups 8 (head h uses B/C group h // 8), chunk_size 128. In the chunked SSD
# algorithm the diagonal blocks are the within-chunk quadratic ("attention-like") part: a masked,
# decay-weighted C B^T applied to dt * x. Slot change: the slot's head dim 128 matches no
# Nemotron Nano model; Nemotron-3-Nano uses 64 (with state 128).
# Workload: 16 sequences, one chunk of 128 tokens each (e.g. 16 short prompts), all 64 heads.
# Semantics: a = dt * A (dt already softplus-ed, A < 0); L[l, s] = exp(sum_{s<j<=l} a_j) for
# l >= s, else 0; y = ((C B^T) * L) (dt x) per head; computed in fp32, rounded to bf16 once.
# Fixed: shapes. Redrawn per draw: x, B, C (N(0,1), bf16); dt log-uniform in [1e-3, 1e-1]
# times softplus(N(0,1)) / log 2 (fp32); A = -U(1, 16) per head (fp32).
import torch
import torch.nn.functional as F

DTYPE = "bf16"
SOL = {
    "flops": 2 * 16 * 8 * 128 * 128 * 128 + 16 * 64 * 128 * 128 * (2 * 64 + 3),
    "bytes": 2 * (16 * 128 * 64 * 64 + 2 * 16 * 128 * 8 * 128) + 4 * (16 * 128 * 64 + 64)
    + 2 * 16 * 128 * 64 * 64,
}


def make_inputs(device="cuda", scale="full"):
    batch, seq, heads, p, groups, n = (16, 128, 64, 64, 8, 128) if scale == "full" else (2, 16, 8, 8, 2, 16)
    x = torch.randn(batch, seq, heads, p, device=device).to(torch.bfloat16)
    dt0 = torch.exp(torch.empty(heads, device=device).uniform_(-6.9, -2.3))
    dt = dt0 * F.softplus(torch.randn(batch, seq, heads, device=device)) / 0.6931
    a = -torch.empty(heads, device=device).uniform_(1, 16)
    b = torch.randn(batch, seq, groups, n, device=device).to(torch.bfloat16)
    c = torch.randn(batch, seq, groups, n, device=device).to(torch.bfloat16)
    return [x, dt, a, b, c]


def reference(x, dt, a, b, c):
    cdt = torch.promote_types(x.dtype, torch.float32)
    bs, l, h, p = x.shape
    g = b.shape[2]
    j = h // g
    dtc = dt.to(cdt)
    a_cs = (dtc * a.to(cdt)).cumsum(1).transpose(1, 2).reshape(bs, g, j, l)  # [B, G, J, L]
    keep = torch.ones(l, l, dtype=torch.bool, device=x.device).tril()
    decay = (a_cs[..., :, None] - a_cs[..., None, :]).masked_fill(~keep, float("-inf")).exp()
    cb = torch.einsum("blgn,bsgn->bgls", c.to(cdt), b.to(cdt))
    xdt = (x.to(cdt) * dtc[..., None]).reshape(bs, l, g, j, p)
    y = torch.einsum("bgjls,bsgjp->blgjp", cb[:, :, None] * decay, xdt)
    return y.reshape(bs, l, h, p).to(x.dtype)
