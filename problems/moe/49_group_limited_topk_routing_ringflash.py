"""Group-limited top-8 MoE routing: fp32 logits = hidden (bf16) @ weight.T, sigmoid, + expert_bias for selection, top-4 of 8 expert groups (group score = sum of its top-2), top-8 experts in descending order; return (indices int64, weights fp32 = scaling factor * normalised sigmoid scores), each [tokens, 8]."""
# Source: Ring-flash-2.0 (inclusionAI, Ling 2.0 / BailingMoeV2 architecture): hidden_size 4096,
# num_experts 256, num_experts_per_tok 8, n_group 8, topk_group 4, sigmoid gating with a learned
# expert bias used for selection only, normalised top-k weights, routed_scaling_factor 2.5.
# Original (MetaKernelBench p49): inputs (hidden_states bf16 [16384, 4096], weight bf16
# [256, 4096], expert_bias bf16 [256] ~ N(0,1), routed_scaling_factor 2.5); outputs
# (topk_indices int64, topk_weights * routed_scaling_factor).
# Semantics: s = sigmoid(hidden @ weight.T) in fp32; b = s + expert_bias; group score = sum of the
# two largest b in each group of 32; the 4 best groups are kept and the experts of the other
# groups get the score 0.0; the 8 largest of these scores are chosen in descending order;
# weight_j = scale * s_j / (sum of the 8 chosen s + 1e-20).
# Workload: 16,384 tokens x 4096 hidden, 256 experts. Fixed: shapes, routing constants.
# Redrawn per draw: hidden ~ N(0,1), weight ~ N(0, 1/4096), expert_bias ~ N(0,1), all bf16; token
# rows are redrawn (up to 16 times) until every decision has a margin >= 1e-4 (4th vs 5th group
# score, and consecutive scores among the 9 best, so the output order is unambiguous).
import torch

DTYPE = "bf16"
EXACT = True
MARGIN = 1e-4
SOL = {
    "flops": 2 * 16384 * 4096 * 256 + 10 * 16384 * 256,
    "bytes": 2 * 16384 * 4096 + 2 * 256 * 4096 + 2 * 256 + (8 + 4) * 16384 * 8,
}

N_GROUP, TOPK_GROUP, TOP_K = 8, 4, 8
ROUTED_SCALING = 2.5


def _route(hidden_states, weight, expert_bias, compute):
    """Chosen experts [T, 8] (descending), their sigmoid scores [T, 8], and each token's margin [T]."""
    scores = torch.sigmoid(hidden_states.to(compute) @ weight.to(compute).T)
    biased = scores + expert_bias.to(compute)
    tokens, experts = biased.shape
    group_scores = biased.view(tokens, N_GROUP, -1).topk(2, dim=-1).values.sum(dim=-1)
    ranked_groups = group_scores.sort(dim=-1, descending=True)
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, ranked_groups.indices[:, :TOPK_GROUP], True)
    masked = biased.masked_fill(~keep.repeat_interleave(experts // N_GROUP, dim=1), 0.0)
    best = masked.topk(TOP_K + 1, dim=-1, sorted=True)
    indices = best.indices[:, :TOP_K]
    group_gap = ranked_groups.values[:, TOPK_GROUP - 1] - ranked_groups.values[:, TOPK_GROUP]
    order_gap = (best.values[:, :-1] - best.values[:, 1:]).min(dim=-1).values
    return indices, scores.gather(1, indices), torch.minimum(group_gap, order_gap)


def make_inputs(device="cuda", scale="full"):
    tokens, hidden, experts = (16384, 4096, 256) if scale == "full" else (48, 64, 256)
    bf = torch.bfloat16
    hidden_states = torch.randn(tokens, hidden, device=device, dtype=bf)
    weight = (torch.randn(experts, hidden, device=device) / hidden ** 0.5).to(bf)
    expert_bias = torch.randn(experts, device=device, dtype=bf)
    for _ in range(16):
        bad = _route(hidden_states, weight, expert_bias, torch.float64)[2] < MARGIN
        if not bool(bad.any()):
            break
        hidden_states[bad] = torch.randn(int(bad.sum()), hidden, device=device, dtype=bf)
    else:
        raise ValueError(f"routing margins under {MARGIN} persist after 16 redraws")
    return [hidden_states, weight, expert_bias, ROUTED_SCALING]


def decision_margin(hidden_states, weight, expert_bias, routed_scaling_factor):
    return float(_route(hidden_states, weight, expert_bias, torch.float64)[2].min())


def reference(hidden_states, weight, expert_bias, routed_scaling_factor):
    compute = torch.promote_types(hidden_states.dtype, torch.float32)
    indices, chosen, _ = _route(hidden_states, weight, expert_bias, compute)
    return indices, chosen / (chosen.sum(dim=-1, keepdim=True) + 1e-20) * routed_scaling_factor
