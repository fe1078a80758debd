"""Group-limited top-8 MoE routing: fp32 router logits = hidden (bf16) @ gate_weight.T, sigmoid, + expert_bias, top-4 of 8 expert groups, top-8 experts; return (indices int32, weights fp32 = 2.5 * normalised sigmoid scores), each [tokens, 8]."""
# Source: Ring-flash-2.0 (inclusionAI, Ling 2.0 / BailingMoeV2 architecture): hidden_size 4096,
# num_experts 256, num_experts_per_tok 8, n_group 8, topk_group 4, sigmoid gating
# (score_function sigmoid) with a learned expert bias used for selection only
# (moe_router_enable_expert_bias), normalised top-k weights, routed_scaling_factor 2.5.
# Semantics: logits = hidden @ gate_weight.T in fp32; s = sigmoid(logits); b = s + expert_bias;
# group score = sum of the two largest b in each of the 8 groups of 32 experts; the 4 best groups
# are kept; the 8 experts with the largest b among them are chosen, in descending order of b;
# weight_j = 2.5 * s_j / sum of the 8 chosen s (the bias does not enter the weights).
# Workload: 16,384 tokens x 4096 hidden, 256 experts. Fixed: shapes, routing constants.
# Redrawn per draw: hidden ~ N(0, 1), gate_weight ~ N(0, 1/4096), expert_bias ~ 0.01 N(0, 1); token
# rows are redrawn until every decision has a margin >= 1e-4 in b (4th vs 5th group score, 8th vs
# 9th eligible expert, and consecutive chosen experts, so the output order is unambiguous).
import torch

DTYPE = "bf16"
EXACT = True
MARGIN = 1e-4
SOL = {
    "flops": 2 * 16384 * 4096 * 256 + 10 * 16384 * 256,
    "bytes": 2 * 16384 * 4096 + 2 * 256 * 4096 + 4 * 256 + (4 + 4) * 16384 * 8,
}

N_GROUP, TOPK_GROUP, TOP_K = 8, 4, 8
ROUTED_SCALING = 2.5


def _route(hidden_states, gate_weight, expert_bias, compute):
    """Chosen experts [T, 8] (descending b), their weights [T, 8], and each token's margin [T]."""
    logits = hidden_states.to(compute) @ gate_weight.to(compute).T
    scores = torch.sigmoid(logits)
    biased = scores + expert_bias.to(compute)
    tokens, experts = biased.shape
    group_scores = biased.view(tokens, N_GROUP, experts // N_GROUP).topk(2, dim=-1).values.sum(dim=-1)
    ranked_groups = group_scores.sort(dim=-1, descending=True)
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, ranked_groups.indices[:, :TOPK_GROUP], True)
    eligible = biased.masked_fill(~keep.repeat_interleave(experts // N_GROUP, dim=1), float("-inf"))
    best = eligible.topk(TOP_K + 1, dim=-1, sorted=True)
    indices = best.indices[:, :TOP_K]
    chosen = scores.gather(1, indices)
    weights = chosen / chosen.sum(dim=-1, keepdim=True) * ROUTED_SCALING
    group_gap = ranked_groups.values[:, TOPK_GROUP - 1] - ranked_groups.values[:, TOPK_GROUP]
    order_gap = (best.values[:, :-1] - best.values[:, 1:]).min(dim=-1).values
    return indices, weights, torch.minimum(group_gap, order_gap)


def make_inputs(device="cuda", scale="full"):
    tokens, hidden, experts = (16384, 4096, 256) if scale == "full" else (48, 64, 256)
    hidden_states = torch.randn(tokens, hidden, device=device).to(torch.bfloat16)
    gate_weight = (torch.randn(experts, hidden, device=device) / hidden ** 0.5).to(torch.bfloat16)
    expert_bias = 0.01 * torch.randn(experts, device=device)
    while True:
        bad = _route(hidden_states, gate_weight, expert_bias, torch.float64)[2] < MARGIN
        n_bad = int(bad.sum())
        if n_bad == 0:
            break
        hidden_states[bad] = torch.randn(n_bad, hidden, device=device).to(torch.bfloat16)
    return [hidden_states, gate_weight, expert_bias]


def decision_margin(hidden_states, gate_weight, expert_bias):
    return float(_route(hidden_states, gate_weight, expert_bias, torch.float64)[2].min())


def reference(hidden_states, gate_weight, expert_bias):
    compute = torch.promote_types(expert_bias.dtype, torch.float32)
    indices, weights, _ = _route(hidden_states, gate_weight, expert_bias, compute)
    return indices.to(torch.int32), weights
