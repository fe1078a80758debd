"""gpt-oss MoE layer: router Linear with bias, top-4 of 128 experts, softmax over the 4 selected logits, experts with interleaved gate/up projection + bias and clamped GLU ((up+1) * gate*sigmoid(1.702 gate), limit 7), down projection + bias, weighted combine (fp32)."""
# Source: gpt-oss-120b config.json: hidden_size 2880, num_local_experts 128, num_experts_per_tok 4,
# intermediate_size 2880, swiglu_limit 7.0; published expert semantics: gate_up projection
# [hidden -> 2 x 2880] with bias whose output columns alternate gate, up (gate = even columns,
# up = odd); gate clamped to <= 7, up clamped to [-7, 7]; glu = gate * sigmoid(1.702 * gate);
# h = (up + 1) * glu; down projection [2880 -> 2880] with bias. Router: Linear(2880 -> 128) with
# bias; the 4 largest logits are kept and softmaxed to give the combine weights.
# Weight layout as stored by the model: gate_up [E, 2880, 5760] and down [E, 2880, 2880] applied
# as h @ W (input dim first).
# Workload: 16,384 tokens, fp32 throughout (128 experts: 12.7 GB of fp32 weights; ~512 tokens per
# expert on average).
# Fixed: shapes, limit, alpha. Redrawn per draw: x (N(0,1)), router weight (N(0,1)/sqrt(2880)) and
# bias (0.1 N), gate_up weights (3 N(0,1)/sqrt(2880), so the clamp at 7 is active for a few
# percent of the values) and biases (0.1 N), down weights (N(0,1)/sqrt(2880)) and biases (0.02 N).
# Rows of x are redrawn until every token's gap between its 4th and 5th router logit is >= 1e-3.
import torch
import torch.nn.functional as F

DTYPE = "fp32"
MARGIN = 1e-3
SOL = {"flops": 2 * 16384 * 2880 * 128 + 2 * 16384 * 4 * 2880 * (5760 + 2880) + 10 * 16384 * 4 * 2880,
       "bytes": 4 * (16384 * 2880 + 128 * 2880 + 128 + 128 * 2880 * 5760 + 128 * 5760 + 128 * 2880 * 2880
                     + 128 * 2880 + 16384 * 2880)}

TOP_K = 4
LIMIT = 7.0
ALPHA = 1.702


def _gaps(x, w_router, b_router):
    logits = F.linear(x.double(), w_router.double(), b_router.double())
    top = logits.topk(TOP_K + 1, dim=-1).values
    return top[:, TOP_K - 1] - top[:, TOP_K]


def decision_margin(x, w_router, b_router, *weights):
    return float(_gaps(x, w_router, b_router).min())


def make_inputs(device="cuda", scale="full"):
    if scale == "smoke":
        t, d, e, f = 48, 32, 16, 32
    else:
        t, d, e, f = 16384, 2880, 128, 2880
    x = torch.randn(t, d, device=device)
    w_router = torch.randn(e, d, device=device) / d ** 0.5
    b_router = 0.1 * torch.randn(e, device=device)
    for _ in range(100):
        bad = _gaps(x, w_router, b_router) < MARGIN
        n = int(bad.sum())
        if n == 0:
            break
        x[bad] = torch.randn(n, d, device=device)
    w_gate_up = torch.randn(e, d, 2 * f, device=device).mul_(3 * d ** -0.5)
    b_gate_up = 0.1 * torch.randn(e, 2 * f, device=device)
    w_down = torch.randn(e, f, d, device=device).mul_(f ** -0.5)
    b_down = 0.02 * torch.randn(e, d, device=device)
    return [x, w_router, b_router, w_gate_up, b_gate_up, w_down, b_down]


def _expert(h, w_gate_up, b_gate_up, w_down, b_down):
    z = torch.addmm(b_gate_up, h, w_gate_up)
    gate = z[:, 0::2].clamp(max=LIMIT)
    up = z[:, 1::2].clamp(min=-LIMIT, max=LIMIT)
    glu = gate * torch.sigmoid(gate * ALPHA)
    return torch.addmm(b_down, (up + 1) * glu, w_down)


def reference(x, w_router, b_router, w_gate_up, b_gate_up, w_down, b_down):
    t, d = x.shape
    e = w_gate_up.shape[0]
    logits = F.linear(x, w_router, b_router)
    top_v, top_i = logits.topk(TOP_K, dim=-1)
    weights = torch.softmax(top_v, dim=-1)
    flat_e = top_i.reshape(-1)
    order = torch.argsort(flat_e, stable=True)
    counts = torch.bincount(flat_e, minlength=e).tolist()
    xs = x[order // TOP_K]
    ys = torch.empty_like(xs)
    start = 0
    for j, n in enumerate(counts):
        if n:
            ys[start:start + n] = _expert(xs[start:start + n], w_gate_up[j], b_gate_up[j], w_down[j], b_down[j])
            start += n
    inv = torch.empty_like(order)
    inv[order] = torch.arange(order.numel(), device=order.device)
    return torch.bmm(weights.unsqueeze(1), ys[inv].view(t, TOP_K, d)).squeeze(1)
