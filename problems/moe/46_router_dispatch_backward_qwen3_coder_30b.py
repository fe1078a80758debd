"""Backward of MoE routing + dispatch/combine (experts excluded): given x, router weight, saved top-8 ids, expert outputs and input-grads in expert-sorted order, and dL/dy, return (dL/dx, dL/dW_router, dL/dexpert_out) (bf16 in, bf16 out)."""
# Source: Qwen3-Coder-30B-A3B-Instruct config.json: hidden_size 2048, num_experts 128,
# num_experts_per_tok 8, norm_topk_prob true, router Linear(2048 -> 128) without bias.
# Forward being differentiated: logits = x @ W_r^T (fp32); p = softmax(logits); the saved top-8
# experts ids[t, 0..7]; weights w = p[ids] / sum (equivalently a softmax over the 8 selected
# logits); dispatch: assignment (t, j) is copied to row q of an expert-sorted buffer, where the
# T*8 assignments are ordered by expert id, ties by (t, j) (a stable sort of ids.flatten());
# combine: y[t] = sum_j w[t, j] * expert_out[q(t, j)].
# Backward outputs: dL/dx = sum_j grad_expert_in[q(t, j)] (the experts' input gradients, unsorted
# and summed) + dlogits @ W_r; dL/dW_r = dlogits^T @ x; dL/dexpert_out[q(t, j)] = w[t, j] * dy[t];
# with dw[t, j] = <dy[t], expert_out[q(t, j)]> and dlogits = scatter over ids of
# w * (dw - sum_j w dw) (zero for unselected experts).
# Workload: 65,536 tokens, 524,288 assignments x 2048. Fixed: shapes.
# Redrawn per draw: x (N(0,1)), W_r (N(0,1)/sqrt(2048)), ids = top-8 of the fp64 logits, expert
# outputs (N(0,1)), dy, grad_expert_in (N(0,1)).
import torch
import torch.nn.functional as F

DTYPE = "bf16"
SOL = {"flops": 2 * 65536 * 2048 * 128 * 3 + 2 * 65536 * 8 * 2048 * 3,
       "bytes": 2 * (65536 * 2048 + 128 * 2048 + 2 * 524288 * 2048 + 65536 * 2048) + 8 * 524288
       + 2 * (65536 * 2048 + 128 * 2048 + 524288 * 2048)}

TOP_K = 8


def make_inputs(device="cuda", scale="full"):
    if scale == "smoke":
        t, d, e = 48, 64, 16
    else:
        t, d, e = 65536, 2048, 128
    bf = torch.bfloat16
    x = torch.randn(t, d, device=device, dtype=bf)
    w_router = (torch.randn(e, d, device=device) / d ** 0.5).to(bf)
    topk_ids = F.linear(x.double(), w_router.double()).topk(TOP_K, dim=-1).indices
    expert_out = torch.randn(t * TOP_K, d, device=device, dtype=bf)
    grad_y = torch.randn(t, d, device=device, dtype=bf)
    grad_expert_in = torch.randn(t * TOP_K, d, device=device, dtype=bf)
    return [x, w_router, topk_ids, expert_out, grad_y, grad_expert_in]


def reference(x, w_router, topk_ids, expert_out, grad_y, grad_expert_in):
    ct = torch.promote_types(x.dtype, torch.float32)
    t, d = x.shape
    k = topk_ids.shape[1]
    order = torch.argsort(topk_ids.reshape(-1), stable=True)       # sorted row q <- assignment order[q]
    inv = torch.empty_like(order)
    inv[order] = torch.arange(order.numel(), device=order.device)  # assignment (t, j) -> sorted row
    logits = F.linear(x.to(ct), w_router.to(ct))
    w = torch.softmax(logits.gather(1, topk_ids), dim=-1)          # renormalised top-k weights
    dy = grad_y.to(ct)
    eo = expert_out[inv].view(t, k, d).to(ct)
    dw = torch.bmm(eo, dy.unsqueeze(-1)).squeeze(-1)
    del eo
    dsel = w * (dw - (w * dw).sum(-1, keepdim=True))
    dlogits = torch.zeros_like(logits).scatter_(1, topk_ids, dsel)
    grad_router = dlogits.t() @ x.to(ct)
    grad_x = grad_expert_in[inv].view(t, k, d).to(ct).sum(1) + dlogits @ w_router.to(ct)
    grad_eo = (w.unsqueeze(-1) * dy.unsqueeze(1)).to(expert_out.dtype).view(t * k, d)[order]
    return grad_x.to(x.dtype), grad_router.to(w_router.dtype), grad_eo
