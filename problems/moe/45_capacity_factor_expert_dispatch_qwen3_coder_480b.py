"""Capacity-factor MoE layer: fp32 softmax router, top-8 of 160 experts with renormalised weights, per-expert capacity ceil(1.25*T*8/160) filled in (rank, token) priority order with overflow dropped, padded [E, C, H] dispatch, SwiGLU experts, weighted combine (bf16 in, bf16 out)."""
# Source: Qwen3-Coder-480B-A35B-Instruct config.json: hidden_size 6144, num_experts 160,
# num_experts_per_tok 8, moe_intermediate_size 2560, norm_topk_prob true, hidden_act silu, router
# without bias. Capacity dispatch as in GShard / Switch Transformer: capacity factor 1.25, capacity
# C = ceil(1.25 * T * k / E); slots are handed out first to every token's 1st choice in token order,
# then to 2nd choices, and so on; an assignment beyond an expert's capacity is dropped (weight
# kept out, no renormalisation after the drop). Tokens are packed into a zero-padded [E, C, H]
# buffer, experts run as batched GEMMs, and out[t] = sum over kept choices of weight * expert_out.
# Router: logits = x @ W_r^T in fp32 (fp64 in the anchor), softmax, top-8, weights / their sum.
# Experts: this is one tensor-parallel rank of a TP2 expert layer: each expert's 2560-wide
# intermediate is split in two, so the rank holds [160, 1280, 6144] gate/up and [160, 6144, 1280]
# down weights and returns its partial sum (before the all-reduce). The full, unsharded layer
# would be 15 GB of bf16 weights (60 GB in the fp64 anchor); the TP2 shard halves that.
# Workload: 8,192 tokens, capacity 512 per expert. Fixed: shapes, capacity factor.
# Redrawn per draw: x = N(0,1) + a shared offset mu (0.2 N(0,1) per channel, redrawn), which
# skews expert popularity (logit offsets W_r mu ~ N(0, 0.2^2)): ~35 of the 160 experts overflow
# and ~8% of the assignments are dropped at full scale;
# W_r (N(0,1)/sqrt(6144)); expert weights (N(0,1)/sqrt(fan_in)). Rows of x are redrawn until, for
# every token, consecutive gaps among its 9 largest router logits are >= 1e-3 (the top-8 set and
# its order, which sets the capacity priority, are then well defined).
import math

import torch
import torch.nn.functional as F

DTYPE = "bf16"
MARGIN = 1e-3
SOL = {"flops": 2 * 8192 * 6144 * 160 + 3 * 2 * 8192 * 8 * 6144 * 1280,
       "bytes": 2 * (8192 * 6144 + 160 * 6144 + 3 * 160 * 6144 * 1280 + 8192 * 6144)}

TOP_K = 8
CAPACITY_FACTOR = 1.25


def _gaps(x, w_router):
    """Per-token smallest gap between consecutive values among the top-(k+1) router logits (fp64)."""
    logits = F.linear(x.double(), w_router.double())
    top = logits.topk(TOP_K + 1, dim=-1).values
    return (top[:, :-1] - top[:, 1:]).min(dim=-1).values


def decision_margin(x, w_router, w_gate, w_up, w_down):
    return float(_gaps(x, w_router).min())


def make_inputs(device="cuda", scale="full"):
    if scale == "smoke":
        t, d, e, f = 64, 64, 16, 32
    else:
        t, d, e, f = 8192, 6144, 160, 1280
    bf = torch.bfloat16
    mu = 0.2 * torch.randn(d, device=device)
    x = (torch.randn(t, d, device=device) + mu).to(bf)
    w_router = (torch.randn(e, d, device=device) / d ** 0.5).to(bf)
    for _ in range(100):
        bad = _gaps(x, w_router) < MARGIN
        n = int(bad.sum())
        if n == 0:
            break
        x[bad] = (torch.randn(n, d, device=device) + mu).to(bf)
    w_gate = torch.randn(e, f, d, device=device, dtype=bf).mul_(d ** -0.5)
    w_up = torch.randn(e, f, d, device=device, dtype=bf).mul_(d ** -0.5)
    w_down = torch.randn(e, d, f, device=device, dtype=bf).mul_(f ** -0.5)
    return [x, w_router, w_gate, w_up, w_down]


def reference(x, w_router, w_gate, w_up, w_down):
    ct = torch.promote_types(x.dtype, torch.float32)
    t, d = x.shape
    e = w_gate.shape[0]
    cap = math.ceil(CAPACITY_FACTOR * t * TOP_K / e)
    probs = torch.softmax(F.linear(x.to(ct), w_router.to(ct)), dim=-1)
    top_p, top_i = probs.topk(TOP_K, dim=-1)
    weights = top_p / top_p.sum(dim=-1, keepdim=True)
    # capacity slots in priority order: all 1st choices (token order), then 2nd choices, ...
    e_flat = top_i.t().reshape(-1)
    onehot = F.one_hot(e_flat, e)
    pos_flat = (onehot.cumsum(0) * onehot).sum(-1) - 1
    keep_flat = pos_flat < cap
    tok_flat = torch.arange(t, device=x.device).repeat(TOP_K)
    buf = x.new_zeros(e, cap, d)
    buf[e_flat[keep_flat], pos_flat[keep_flat]] = x[tok_flat[keep_flat]]
    act = F.silu(torch.bmm(buf, w_gate.transpose(1, 2))) * torch.bmm(buf, w_up.transpose(1, 2))
    out_e = torch.bmm(act, w_down.transpose(1, 2))
    # combine: gather each token's k results (dropped ones have weight 0)
    pos = pos_flat.view(TOP_K, t).t()
    keep = pos < cap
    vals = out_e[top_i, pos.clamp(max=cap - 1)]
    w_kept = (weights * keep).unsqueeze(1)
    y = torch.bmm(w_kept, vals.to(ct)).squeeze(1)
    return y.to(x.dtype)
