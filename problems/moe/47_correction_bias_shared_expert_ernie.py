"""MoE layer with aux-free correction bias and a shared expert: fp32 softmax router, top-8 of 64 experts chosen by (prob + bias), combine weights = unbiased probs renormalised, SwiGLU experts plus an always-on SwiGLU shared expert (bf16 in, bf16 out)."""
# Source: ERNIE-4.5-300B-A47B config.json: hidden_size 8192, moe_num_experts 64, moe_k 8,
# moe_intermediate_size 3584, hidden_act silu; ERNIE 4.5 MoE routing: gate logits in fp32, softmax,
# experts selected by top-k of (probability + e_score_correction_bias), combine weights = the
# selected unbiased probabilities divided by their sum (clamped at 1e-12). Shared expert as in the
# slot: one SwiGLU block of intermediate 7168 (= 2 x 3584), added to the routed output.
# Workload: batch 64 x 128 = 8,192 tokens; routed expert weights 11.3 GB bf16.
# Fixed: shapes. Redrawn per draw: x (N(0,1)), router weight (1.5 N(0,1)/sqrt(8192): logits ~
# N(0, 1.5^2)), correction bias (fp32, 0.01 N(0,1): same scale as the probabilities ~1/64), expert
# and shared weights (N(0,1)/sqrt(fan_in)). Rows of x are redrawn until every token's gap between
# its 8th and 9th biased score is >= 1e-4 (the selected set is then well defined).
import torch
import torch.nn.functional as F

DTYPE = "bf16"
MARGIN = 1e-4
SOL = {"flops": 2 * 8192 * 8192 * 64 + 3 * 2 * 8192 * 8 * 8192 * 3584 + 3 * 2 * 8192 * 8192 * 7168,
       "bytes": 2 * (8192 * 8192 + 64 * 8192 + 3 * 64 * 8192 * 3584 + 3 * 8192 * 7168 + 8192 * 8192) + 4 * 64}

TOP_K = 8


def _gaps(x, w_router, bias):
    x2 = x.reshape(-1, x.shape[-1]).double()
    biased = torch.softmax(F.linear(x2, w_router.double()), dim=-1) + bias.double()
    top = biased.topk(TOP_K + 1, dim=-1).values
    return top[:, TOP_K - 1] - top[:, TOP_K]


def decision_margin(x, w_router, bias, *weights):
    return float(_gaps(x, w_router, bias).min())


def _swiglu(h, w_gate, w_up, w_down):
    return F.linear(F.silu(F.linear(h, w_gate)) * F.linear(h, w_up), w_down)


def make_inputs(device="cuda", scale="full"):
    if scale == "smoke":
        b, s, d, e, f, fs = 2, 16, 64, 16, 32, 64
    else:
        b, s, d, e, f, fs = 64, 128, 8192, 64, 3584, 7168
    bf = torch.bfloat16
    x = torch.randn(b, s, d, device=device, dtype=bf)
    w_router = (1.5 * torch.randn(e, d, device=device) / d ** 0.5).to(bf)
    bias = 0.01 * torch.randn(e, device=device)
    flat = x.view(-1, d)
    for _ in range(100):
        bad = _gaps(flat, w_router, bias) < MARGIN
        n = int(bad.sum())
        if n == 0:
            break
        flat[bad] = torch.randn(n, d, device=device, dtype=bf)
    w_gate = torch.randn(e, f, d, device=device, dtype=bf).mul_(d ** -0.5)
    w_up = torch.randn(e, f, d, device=device, dtype=bf).mul_(d ** -0.5)
    w_down = torch.randn(e, d, f, device=device, dtype=bf).mul_(f ** -0.5)
    ws_gate = torch.randn(fs, d, device=device, dtype=bf).mul_(d ** -0.5)
    ws_up = torch.randn(fs, d, device=device, dtype=bf).mul_(d ** -0.5)
    ws_down = torch.randn(d, fs, device=device, dtype=bf).mul_(fs ** -0.5)
    return [x, w_router, bias, w_gate, w_up, w_down, ws_gate, ws_up, ws_down]


def reference(x, w_router, bias, w_gate, w_up, w_down, ws_gate, ws_up, ws_down):
    ct = torch.promote_types(x.dtype, torch.float32)
    d = x.shape[-1]
    h = x.reshape(-1, d)
    t = h.shape[0]
    e = w_gate.shape[0]
    probs = torch.softmax(F.linear(h.to(ct), w_router.to(ct)), dim=-1)
    top_i = (probs + bias.to(ct)).topk(TOP_K, dim=-1).indices
    top_p = probs.gather(1, top_i)
    weights = top_p / top_p.sum(dim=-1, keepdim=True).clamp_min(1e-12)
    # dispatch: sort the t*k assignments by expert, run each expert on its contiguous rows
    flat_e = top_i.reshape(-1)
    order = torch.argsort(flat_e, stable=True)
    counts = torch.bincount(flat_e, minlength=e).tolist()
    xs = h[order // TOP_K]
    ys = torch.empty_like(xs)
    start = 0
    for j, n in enumerate(counts):
        if n:
            ys[start:start + n] = _swiglu(xs[start:start + n], w_gate[j], w_up[j], w_down[j])
            start += n
    inv = torch.empty_like(order)
    inv[order] = torch.arange(order.numel(), device=order.device)
    routed = torch.bmm(weights.unsqueeze(1), ys[inv].view(t, TOP_K, d).to(ct)).squeeze(1)
    out = routed + _swiglu(h, ws_gate, ws_up, ws_down).to(ct)
    return out.to(x.dtype).view(x.shape)
