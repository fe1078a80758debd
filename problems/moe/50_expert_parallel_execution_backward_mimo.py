"""Backward of routed SwiGLU experts y[t] = sum_j w[t,j] * E_{ids[t,j]}(x[t]) with saved top-8 ids and weights: return (dL/dx, dL/dw, dL/dW_gate, dL/dW_up, dL/dW_down) for all 256 experts (fp32)."""
# Source: XiaomiMiMo MiMo-V2-Flash config: hidden_size 4096, 256 routed experts, 8 experts per
# token, SwiGLU experts (silu). Expert E(h) = W_down (silu(W_gate h) * W_up h), no biases.
# Original (MetaKernelBench p50): inputs (grad_output, hidden_states, topk_indices, topk_weights,
# gate [256, 1024, 4096], up [256, 1024, 4096], down [256, 4096, 1024]); expert intermediate 1024
# (the original's adaptation of MiMo's wider experts); 5 outputs.
# Semantics: experts run one after another in id order on the tokens routed to them (activations
# recomputed from x); dw[t, j] = <dy[t], E(x[t])>; each expert's weight gradients are written
# whole (zero for an expert with no tokens); dx sums a token's 8 expert input gradients.
# Workload: 6,144 tokens, hidden 4096, 256 experts, top-8 (49,152 assignments, ~192 per expert).
# fp32 weights and weight gradients take 25.8 GB (the fp64 anchor twice that).
# Fixed: shapes. Redrawn per draw: dy, x (N(0,1)); ids = 8 distinct experts per token uniformly at
# random (the first 8 of a random permutation, in that order); w = softmax over the 8 of N(0,1);
# weights 0.02 N(0,1).
import torch
import torch.nn.functional as F

DTYPE = "fp32"
SOL = {"flops": 8 * 2 * 49152 * 4096 * 1024 + 12 * 49152 * 1024,
       "bytes": 4 * (2 * 6144 * 4096 + 6144 * 8 + 3 * 256 * 4096 * 1024) + 8 * 6144 * 8
       + 4 * (6144 * 4096 + 6144 * 8 + 3 * 256 * 4096 * 1024)}


def make_inputs(device="cuda", scale="full"):
    t, d, e, f = (24, 32, 16, 16) if scale == "smoke" else (6144, 4096, 256, 1024)
    grad_y = torch.randn(t, d, device=device)
    x = torch.randn(t, d, device=device)
    topk_ids = torch.rand(t, e, device=device).argsort(dim=-1)[:, :8]
    topk_weights = torch.softmax(torch.randn(t, 8, device=device), dim=-1)
    w_gate = 0.02 * torch.randn(e, f, d, device=device)
    w_up = 0.02 * torch.randn(e, f, d, device=device)
    w_down = 0.02 * torch.randn(e, d, f, device=device)
    return [grad_y, x, topk_ids, topk_weights, w_gate, w_up, w_down]


def reference(grad_y, x, topk_ids, topk_weights, w_gate, w_up, w_down):
    grad_x = torch.zeros_like(x)
    grad_w = torch.zeros_like(topk_weights)
    g_gate, g_up, g_down = torch.zeros_like(w_gate), torch.zeros_like(w_up), torch.zeros_like(w_down)
    for e in range(w_gate.shape[0]):
        tok, slot = (topk_ids == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        h, dy = x[tok], grad_y[tok]
        g = F.linear(h, w_gate[e])
        u = F.linear(h, w_up[e])
        s = torch.sigmoid(g)
        a = g * s
        act = a * u
        grad_w[tok, slot] = (F.linear(act, w_down[e]) * dy).sum(-1)
        d_out = dy * topk_weights[tok, slot, None]
        g_down[e] = d_out.t() @ act
        d_act = d_out @ w_down[e]
        du = d_act * a
        dg = d_act * u * s * (1 + g * (1 - s))
        g_gate[e] = dg.t() @ h
        g_up[e] = du.t() @ h
        grad_x.index_add_(0, tok, dg @ w_gate[e] + du @ w_up[e])  # a token picks an expert at most once
    return grad_x, grad_w, g_gate, g_up, g_down
