"""Backward of Qwen3-Coder MoE routing (router projection, softmax, top-8, renormalisation) from saved probabilities: given x, router weight, probs, top-8 ids, the sum of the top-8 probs and the incoming gradients of the routing weights, the dispatch mask and the router logits, return (dL/dx, dL/dW_router) (bf16 out)."""
# Source: Qwen3-Coder-30B-A3B-Instruct config.json: hidden_size 2048, num_experts 128,
# num_experts_per_tok 8, norm_topk_prob true, router Linear(2048 -> 128) without bias.
# Forward being differentiated: logits = x W^T; p = softmax(logits) (fp32); ids = top-8 of p;
# routing weights w = p[ids] / S with S = sum of the 8 selected p; the dispatch mask
# one_hot(ids) laid out [E, 8, T]; the logits also leave the block (for the auxiliary loss).
# Original (MetaKernelBench p46): inputs (hidden_states, gate_weight, routing_probs,
# selected_experts, routing_weights_sum, grad_routing_weights, grad_expert_mask [E, 8, T],
# grad_router_logits [T, E]), 2 outputs.
# Semantics (fp32, fp64 in the anchor): dp[ids_j] += dw_j / S - (sum_i dw_i p[ids_i]) / S^2;
# the dispatch mask's gradient passes straight through to the probabilities,
# dp[t, e] += sum_k dmask[e, k, t]; dlogits = p * (dp - sum_e dp * p) + dL/dlogits; then
# dlogits is cast to the activation dtype and dx = dlogits @ W, dW = dlogits^T @ x (bf16 GEMMs).
# (The mask term's form is our reading: the recipe hides it.)
# Workload: 65,536 tokens, hidden 2048, 128 experts, top-8. Fixed: shapes.
# Redrawn per draw: x (N(0,1), bf16); W (0.02 N(0,1), bf16); logits N(0,1) -> p (fp32), ids and S
# from p; the three incoming gradients N(0,1) (bf16).
import torch

DTYPE = "bf16"
SOL = {"flops": 2 * 2 * 65536 * 2048 * 128 + 20 * 65536 * 128,
       "bytes": 2 * (65536 * 2048 + 128 * 2048) + 4 * 65536 * 128 + 8 * 65536 * 8 + 4 * 65536
       + 2 * (65536 * 8 + 128 * 8 * 65536 + 65536 * 128) + 2 * (65536 * 2048 + 128 * 2048)}

TOP_K = 8


def make_inputs(device="cuda", scale="full"):
    t, d, e = (65536, 2048, 128) if scale == "full" else (48, 64, 16)
    bf = torch.bfloat16
    x = torch.randn(t, d, device=device, dtype=bf)
    w_router = (0.02 * torch.randn(e, d, device=device)).to(bf)
    probs = torch.softmax(torch.randn(t, e, device=device), dim=-1)
    top_p, ids = probs.topk(TOP_K, dim=-1)
    top_sum = top_p.sum(dim=-1, keepdim=True)
    grad_w = torch.randn(t, TOP_K, device=device, dtype=bf)
    grad_mask = torch.randn(e, TOP_K, t, device=device, dtype=bf)
    grad_logits = torch.randn(t, e, device=device, dtype=bf)
    return [x, w_router, probs, ids, top_sum, grad_w, grad_mask, grad_logits]


def reference(x, w_router, probs, ids, top_sum, grad_w, grad_mask, grad_logits):
    ct = probs.dtype
    gw = grad_w.to(ct)
    top_p = probs.gather(1, ids)
    d_top = gw / top_sum - (gw * top_p).sum(dim=-1, keepdim=True) / top_sum.pow(2)
    dp = torch.zeros_like(probs).scatter_add_(1, ids, d_top)
    dp = dp + grad_mask.to(ct).sum(dim=1).t()
    dlogits = probs * (dp - (dp * probs).sum(dim=-1, keepdim=True)) + grad_logits.to(ct)
    dl = dlogits.to(x.dtype)
    return dl @ w_router, dl.t() @ x
