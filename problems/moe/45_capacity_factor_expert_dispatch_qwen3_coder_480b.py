"""Capacity-factor MoE dispatch from given routing: top-8 expert ids and weights per token, per-expert capacity ceil(1.25*T*8/160) filled in token order with overflow dropped, zero-padded [E, C, H] buffers, batched SwiGLU experts ([E, H, I] weight layout), weighted combine (bf16 in, bf16 out)."""
# Source: Qwen3-Coder-480B-A35B-Instruct config.json: hidden_size 6144, num_experts 160,
# num_experts_per_tok 8, moe_intermediate_size 2560, hidden_act silu. Capacity dispatch as in
# GShard / Switch Transformer with capacity factor 1.25: C = ceil(1.25 * T * k / E) = 512.
# Original (MetaKernelBench p45): inputs (hidden_states [T, 6144], selected_experts [T, 8],
# routing_weights [T, 8] bf16, gate and up weights [160, 6144, 2560], down weights
# [160, 2560, 6144]); the routing is given (no router), expert assignments drawn popularity-skewed
# so the capacity cutoff is observable.
# Semantics: the T*8 assignments are ordered by expert, ties in token order (then choice order);
# an assignment whose position in its expert's list is >= C is dropped (no renormalisation).
# Kept tokens fill a zero-padded [E, C, H] buffer; g = buf @ W_gate[e], u = buf @ W_up[e]
# (bf16 GEMMs, fp32 accumulate), a = silu(g) * u in fp32 rounded to bf16, y = a @ W_down[e];
# out[t] = sum over t's kept assignments of weight * y, in fp32, rounded to bf16 once.
# (The capacity factor and the tie order are our reading: the recipe hides them.)
# Workload: 8,192 tokens, capacity 512; the unsharded expert weights are 15.1 GB of bf16.
# Fixed: shapes, capacity factor. Redrawn per draw: x (N(0,1)); expert ids = the 8 largest of
# popularity + Gumbel noise per token (popularity 0.5 N(0,1) per expert, so popular experts
# overflow); weights U(0,1) normalised per token (bf16); expert weights N(0,1)/sqrt(fan_in).
import math

import torch
import torch.nn.functional as F

DTYPE = "bf16"
SOL = {"flops": 3 * 2 * 160 * 512 * 6144 * 2560,
       "bytes": 2 * (8192 * 6144 + 3 * 160 * 6144 * 2560 + 8192 * 8 + 8192 * 6144) + 8 * 8192 * 8}

TOP_K = 8
CAPACITY_FACTOR = 1.25
POPULARITY_STD = 0.5


def make_inputs(device="cuda", scale="full"):
    t, d, e, f = (8192, 6144, 160, 2560) if scale == "full" else (64, 64, 16, 32)
    bf = torch.bfloat16
    x = torch.randn(t, d, device=device, dtype=bf)
    popularity = torch.randn(e, device=device) * POPULARITY_STD
    gumbel = -torch.log(-torch.log(torch.rand(t, e, device=device)))
    selected = (popularity + gumbel).argsort(dim=-1, descending=True)[:, :TOP_K]
    weights = torch.rand(t, TOP_K, device=device)
    weights = (weights / weights.sum(dim=-1, keepdim=True)).to(bf)
    w_gate = torch.randn(e, d, f, device=device, dtype=bf).mul_(d ** -0.5)
    w_up = torch.randn(e, d, f, device=device, dtype=bf).mul_(d ** -0.5)
    w_down = torch.randn(e, f, d, device=device, dtype=bf).mul_(f ** -0.5)
    return [x, selected, weights, w_gate, w_up, w_down]


def reference(x, selected, weights, w_gate, w_up, w_down):
    ct = torch.promote_types(x.dtype, torch.float32)
    t, d = x.shape
    e = w_gate.shape[0]
    cap = math.ceil(CAPACITY_FACTOR * t * TOP_K / e)
    flat_e = selected.reshape(-1)
    order = torch.argsort(flat_e, stable=True)                 # by expert, then token, then choice
    sorted_e = flat_e[order]
    counts = torch.bincount(sorted_e, minlength=e)
    pos = torch.arange(order.numel(), device=x.device) - (counts.cumsum(0) - counts)[sorted_e]
    keep = pos < cap
    kept, kept_e, kept_pos = order[keep], sorted_e[keep], pos[keep]
    tok = kept // TOP_K
    buf = x.new_zeros(e, cap, d)
    buf[kept_e, kept_pos] = x[tok]
    act = F.silu(torch.bmm(buf, w_gate).to(ct)) * torch.bmm(buf, w_up).to(ct)
    y = torch.bmm(act.to(x.dtype), w_down)
    per_choice = torch.zeros(t * TOP_K, d, dtype=ct, device=x.device)  # dropped choices stay zero
    per_choice[kept] = y[kept_e, kept_pos].to(ct) * weights.reshape(-1)[kept].to(ct)[:, None]
    return per_choice.view(t, TOP_K, d).sum(1).to(x.dtype)
