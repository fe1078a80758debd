"""MoE layer with a sigmoid-gated shared expert: fp32 softmax router over 512 experts, top-10 with renormalised weights, SwiGLU experts (intermediate 512), plus sigmoid(x . w_sg) * SwiGLU shared expert (bf16 in, bf16 out)."""
# Source: Qwen3-Next-80B-A3B-Instruct config.json: hidden_size 2048, num_experts 512,
# num_experts_per_tok 10, moe_intermediate_size 512, shared_expert_intermediate_size 512,
# norm_topk_prob true, hidden_act silu; the shared expert's output is scaled per token by
# sigmoid(shared_expert_gate(x)), a Linear(2048 -> 1) without bias.
# Router: logits = x @ W_r^T in fp32 (fp64 in the anchor), softmax, top-10, weights / their sum.
# Workload: batch 64 x 613 tokens = 39,232 tokens (~766 assignments per expert on average).
# Fixed: shapes. Redrawn per draw: x (N(0,1)), W_r (N(0,1)/sqrt(2048)), shared gate
# (N(0,1)/sqrt(2048)), expert and shared weights (N(0,1)/sqrt(fan_in)). Rows of x are redrawn until
# every token's gap between its 10th and 11th router logit is >= 1e-3.
import torch
import torch.nn.functional as F

DTYPE = "bf16"
MARGIN = 1e-3
SOL = {"flops": 2 * 39232 * 2048 * 513 + 3 * 2 * 39232 * 10 * 2048 * 512 + 3 * 2 * 39232 * 2048 * 512,
       "bytes": 2 * (39232 * 2048 + 513 * 2048 + 3 * 512 * 2048 * 512 + 3 * 2048 * 512 + 39232 * 2048)}

TOP_K = 10


def _gaps(x, w_router):
    logits = F.linear(x.reshape(-1, x.shape[-1]).double(), w_router.double())
    top = logits.topk(TOP_K + 1, dim=-1).values
    return top[:, TOP_K - 1] - top[:, TOP_K]


def decision_margin(x, w_router, *weights):
    return float(_gaps(x, w_router).min())


def _swiglu(h, w_gate, w_up, w_down):
    return F.linear(F.silu(F.linear(h, w_gate)) * F.linear(h, w_up), w_down)


def make_inputs(device="cuda", scale="full"):
    if scale == "smoke":
        b, s, d, e, f = 2, 16, 64, 32, 16
    else:
        b, s, d, e, f = 64, 613, 2048, 512, 512
    bf = torch.bfloat16
    x = torch.randn(b, s, d, device=device, dtype=bf)
    w_router = (torch.randn(e, d, device=device) / d ** 0.5).to(bf)
    flat = x.view(-1, d)
    for _ in range(100):
        bad = _gaps(flat, w_router) < MARGIN
        n = int(bad.sum())
        if n == 0:
            break
        flat[bad] = torch.randn(n, d, device=device, dtype=bf)
    w_gate = torch.randn(e, f, d, device=device, dtype=bf).mul_(d ** -0.5)
    w_up = torch.randn(e, f, d, device=device, dtype=bf).mul_(d ** -0.5)
    w_down = torch.randn(e, d, f, device=device, dtype=bf).mul_(f ** -0.5)
    ws_gate = torch.randn(f, d, device=device, dtype=bf).mul_(d ** -0.5)
    ws_up = torch.randn(f, d, device=device, dtype=bf).mul_(d ** -0.5)
    ws_down = torch.randn(d, f, device=device, dtype=bf).mul_(f ** -0.5)
    w_shared_gate = (torch.randn(1, d, device=device) / d ** 0.5).to(bf)
    return [x, w_router, w_gate, w_up, w_down, ws_gate, ws_up, ws_down, w_shared_gate]


def reference(x, w_router, w_gate, w_up, w_down, ws_gate, ws_up, ws_down, w_shared_gate):
    ct = torch.promote_types(x.dtype, torch.float32)
    d = x.shape[-1]
    h = x.reshape(-1, d)
    t = h.shape[0]
    e = w_gate.shape[0]
    probs = torch.softmax(F.linear(h.to(ct), w_router.to(ct)), dim=-1)
    top_p, top_i = probs.topk(TOP_K, dim=-1)
    weights = top_p / top_p.sum(dim=-1, keepdim=True)
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
    gate = torch.sigmoid(F.linear(h.to(ct), w_shared_gate.to(ct)))
    out = routed + gate * _swiglu(h, ws_gate, ws_up, ws_down).to(ct)
    return out.to(x.dtype).view(x.shape)
