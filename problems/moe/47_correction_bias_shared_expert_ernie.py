"""ERNIE-4.5 MoE block: fp32 softmax router over 64 experts, top-8 chosen by (prob + correction bias), combine weights = unbiased probs / max(their sum, norm_min), SwiGLU experts accumulated in bf16, plus an always-on SwiGLU shared expert; returns (out bf16 [B,S,H], router logits fp32 [T,64])."""
# Source: ERNIE-4.5-300B-A47B config.json: hidden_size 8192, moe_num_experts 64, moe_k 8,
# moe_intermediate_size 3584, hidden_act silu; ERNIE 4.5 MoE routing: gate logits in fp32,
# softmax, experts selected by top-k of (probability + e_score_correction_bias), combine weights =
# the selected unbiased probabilities divided by their sum clamped at norm_min. Shared expert: one
# SwiGLU block of intermediate 7168, added to the routed output.
# Original (MetaKernelBench p47): inputs (hidden_states, gate_weight fp32 [64, 8192],
# e_score_correction_bias fp32 [1, 64], expert gate/up [64, 3584, 8192], down [64, 8192, 3584],
# shared gate/up [7168, 8192], down [8192, 7168], norm_min 1e-10); 2 outputs.
# Semantics: each expert's bf16 SwiGLU output is scaled by its fp32 weight, rounded to bf16 and
# index-added into a bf16 accumulator, experts in id order (as the model's block does); then the
# shared expert's bf16 output is added.
# Workload: batch 64 x 128 = 8,192 tokens; routed expert weights 11.3 GB bf16.
# Fixed: shapes, norm_min. Redrawn per draw: x (N(0,1), bf16), router weight (N(0,1)/sqrt(8192),
# fp32), correction bias (0.02 N(0,1), fp32), expert and shared weights (N(0,1)/sqrt(fan_in), bf16).
# Rows of x are redrawn until every token's gap between its 8th and 9th biased score is >= 1e-4.
import torch
import torch.nn.functional as F

DTYPE = "bf16"
MARGIN = 1e-4
SOL = {"flops": 2 * 8192 * 8192 * 64 + 3 * 2 * 8192 * 8 * 8192 * 3584 + 3 * 2 * 8192 * 8192 * 7168,
       "bytes": 2 * (8192 * 8192 + 3 * 64 * 8192 * 3584 + 3 * 8192 * 7168 + 8192 * 8192) + 4 * (64 * 8192 + 64 + 8192 * 64)}

TOP_K = 8
NORM_MIN = 1e-10


def _gaps(x, w_router, bias):
    biased = torch.softmax(F.linear(x.double(), w_router.double()), dim=-1) + bias.double()
    top = biased.topk(TOP_K + 1, dim=-1).values
    return top[:, TOP_K - 1] - top[:, TOP_K]


def decision_margin(x, w_router, bias, *weights):
    return float(_gaps(x.reshape(-1, x.shape[-1]), w_router, bias).min())


def _swiglu(h, w_gate, w_up, w_down):
    return F.linear(F.silu(F.linear(h, w_gate)) * F.linear(h, w_up), w_down)


def make_inputs(device="cuda", scale="full"):
    if scale == "smoke":
        b, s, d, e, f, fs = 2, 16, 64, 16, 32, 64
    else:
        b, s, d, e, f, fs = 64, 128, 8192, 64, 3584, 7168
    bf = torch.bfloat16
    x = torch.randn(b, s, d, device=device, dtype=bf)
    w_router = torch.randn(e, d, device=device) / d ** 0.5
    bias = 0.02 * torch.randn(1, e, device=device)
    flat = x.view(-1, d)
    for _ in range(16):
        bad = _gaps(flat, w_router, bias) < MARGIN
        if not bool(bad.any()):
            break
        flat[bad] = torch.randn(int(bad.sum()), d, device=device, dtype=bf)
    else:
        raise ValueError(f"routing margins under {MARGIN} persist after 16 redraws")
    w_gate = torch.randn(e, f, d, device=device, dtype=bf).mul_(d ** -0.5)
    w_up = torch.randn(e, f, d, device=device, dtype=bf).mul_(d ** -0.5)
    w_down = torch.randn(e, d, f, device=device, dtype=bf).mul_(f ** -0.5)
    ws_gate = torch.randn(fs, d, device=device, dtype=bf).mul_(d ** -0.5)
    ws_up = torch.randn(fs, d, device=device, dtype=bf).mul_(d ** -0.5)
    ws_down = torch.randn(d, fs, device=device, dtype=bf).mul_(fs ** -0.5)
    return [x, w_router, bias, w_gate, w_up, w_down, ws_gate, ws_up, ws_down, NORM_MIN]


def reference(x, w_router, bias, w_gate, w_up, w_down, ws_gate, ws_up, ws_down, norm_min):
    ct = torch.promote_types(w_router.dtype, torch.float32)
    h = x.reshape(-1, x.shape[-1])
    logits = F.linear(h.to(ct), w_router.to(ct))
    probs = torch.softmax(logits, dim=-1)
    top_i = (probs + bias.to(ct)).topk(TOP_K, dim=-1).indices
    top_p = probs.gather(1, top_i)
    weights = top_p / top_p.sum(dim=-1, keepdim=True).clamp_min(norm_min)
    out = torch.zeros_like(h)
    for e in range(w_gate.shape[0]):
        tok, slot = (top_i == e).nonzero(as_tuple=True)
        if tok.numel():
            y = _swiglu(h[tok], w_gate[e], w_up[e], w_down[e]) * weights[tok, slot, None]
            out.index_add_(0, tok, y.to(h.dtype))  # a token picks an expert at most once
    out = out + _swiglu(h, ws_gate, ws_up, ws_down)
    return out.view(x.shape), logits
