"""DeepSeek-V3 MoE layer on one expert-parallel rank: sigmoid grouped top-8 routing (8 groups, top-4 groups, bias, scale 2.5) then FP8 block-scaled (128x128) SwiGLU experts 32..63; bf16 out [tokens, 7168]."""
# Source: DeepSeek-V3 config.json: hidden_size 7168, moe_intermediate_size 2048, n_routed_experts
# 256, num_experts_per_tok 8, n_group 8, topk_group 4, scoring_func sigmoid, topk_method
# noaux_tc (e_score_correction_bias), norm_topk_prob true, routed_scaling_factor 2.5; FP8 e4m3
# weights with 128x128 block scales and activations with 1x128 (per token, per 128 channels) scales.
# Routing (all tokens, all 256 experts): s = sigmoid(logits); b = s + bias; group score = sum of the
# two largest b in each group of 32 experts; keep the 4 best groups; the 8 experts with the largest
# b among them are chosen; weight_j = 2.5 * s_j / sum of the chosen s.
# Experts: this rank holds the 32 experts 32..63 (local expert offset 32); only (token, expert)
# pairs routed to them contribute. Expert e: h = x @ W1[e].T (W1 [4096, 7168]: rows 0..2047 gate,
# 2048..4095 up), a = silu(gate) * up, y = a @ W2[e].T (W2 [7168, 2048]); out[t] = sum of
# weight * y over t's local experts (zero for tokens with none). Everything is dequantized
# (fp8 value * its block scale) and computed in fp32; the intermediate a is not requantized;
# out is rounded to bf16 once.
# Layout: routing_logits fp32 [T, 256]; routing_bias bf16 [256]; hidden_states fp8 [T, 7168];
# hidden_states_scale fp32 [T, 56]; gemm1_weights fp8 [32, 4096, 7168], gemm1_weights_scale fp32
# [32, 32, 56]; gemm2_weights fp8 [32, 7168, 2048], gemm2_weights_scale fp32 [32, 56, 16].
# Workload: 14,107 tokens; about 14,107 routed (token, local expert) pairs on average (1/8 of the
# 8 per token), hence ~1.24 TFLOP in the experts. Fixed: shapes, routing constants.
# Redrawn per draw: logits ~ N(0, 1) (rows redrawn until every token's routing margins, the gap
# between the 4th and 5th group score and between the 8th and 9th eligible expert, are >= 1e-4),
# bias ~ 0.01 N(0, 1) (small, like a load-balancing bias: the local load stays within ~5% of 1/8),
# fp8 values ~ 96 N(0, 1) clamped to +-448, block scales (0.5..1.5) / (96
# sqrt(fan_in)) for weights and (0.5..1.5) / 96 for activations.
import torch

DTYPE = "fp8"
MARGIN = 1e-4
SOL = {
    "flops": 2 * 14107 * (4096 * 7168 + 7168 * 2048),
    "bytes": 4 * 14107 * 256 + 2 * 256 + 14107 * 7168 + 4 * 14107 * 56 + 32 * 4096 * 7168 + 4 * 32 * 32 * 56
    + 32 * 7168 * 2048 + 4 * 32 * 56 * 16 + 2 * 14107 * 7168,
}

N_EXPERTS, N_GROUP, TOPK_GROUP, TOP_K = 256, 8, 4, 8
LOCAL_EXPERT_OFFSET = 32
ROUTED_SCALING = 2.5
BLOCK = 128


def _route(routing_logits, routing_bias, compute):
    """Chosen expert ids [T, 8], their weights [T, 8], and each token's decision margin [T]."""
    scores = torch.sigmoid(routing_logits.to(compute))
    biased = scores + routing_bias.to(compute)
    tokens = scores.shape[0]
    grouped = biased.view(tokens, N_GROUP, N_EXPERTS // N_GROUP)
    group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
    ranked_groups = group_scores.sort(dim=-1, descending=True)
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, ranked_groups.indices[:, :TOPK_GROUP], True)
    eligible = biased.masked_fill(~keep.repeat_interleave(N_EXPERTS // N_GROUP, dim=1), float("-inf"))
    best = eligible.topk(TOP_K + 1, dim=-1)
    experts = best.indices[:, :TOP_K]
    chosen = scores.gather(1, experts)
    weights = chosen / chosen.sum(dim=-1, keepdim=True) * ROUTED_SCALING
    group_gap = ranked_groups.values[:, TOPK_GROUP - 1] - ranked_groups.values[:, TOPK_GROUP]
    expert_gap = best.values[:, TOP_K - 1] - best.values[:, TOP_K]
    return experts, weights, torch.minimum(group_gap, expert_gap)


def _fp8(shape, device):
    return (96.0 * torch.randn(shape, device=device)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)


def _scales(shape, base, device):
    return (0.5 + torch.rand(shape, device=device)) * base


def make_inputs(device="cuda", scale="full"):
    tokens, hidden, inter = (14107, 7168, 2048) if scale == "full" else (64, 256, 128)
    local = 32
    routing_bias = (0.01 * torch.randn(N_EXPERTS, device=device)).to(torch.bfloat16)
    routing_logits = torch.randn(tokens, N_EXPERTS, device=device)
    while True:
        margin = _route(routing_logits, routing_bias, torch.float64)[2]
        bad = margin < MARGIN
        n_bad = int(bad.sum())
        if n_bad == 0:
            break
        routing_logits[bad] = torch.randn(n_bad, N_EXPERTS, device=device)
    hidden_states = _fp8((tokens, hidden), device)
    hidden_states_scale = _scales((tokens, hidden // BLOCK), 1.0 / 96.0, device)
    gemm1_weights = _fp8((local, 2 * inter, hidden), device)
    gemm1_weights_scale = _scales((local, 2 * inter // BLOCK, hidden // BLOCK), 1.0 / (96.0 * hidden ** 0.5), device)
    gemm2_weights = _fp8((local, hidden, inter), device)
    gemm2_weights_scale = _scales((local, hidden // BLOCK, inter // BLOCK), 1.0 / (96.0 * inter ** 0.5), device)
    return [routing_logits, routing_bias, hidden_states, hidden_states_scale,
            gemm1_weights, gemm1_weights_scale, gemm2_weights, gemm2_weights_scale]


def decision_margin(routing_logits, routing_bias, *rest):
    return float(_route(routing_logits, routing_bias, torch.float64)[2].min())


def _dequant(weight, scale, compute):
    rows, cols = weight.shape
    blocks = weight.to(compute).view(rows // BLOCK, BLOCK, cols // BLOCK, BLOCK) * scale.to(compute)[:, None, :, None]
    return blocks.view(rows, cols)


def reference(routing_logits, routing_bias, hidden_states, hidden_states_scale,
              gemm1_weights, gemm1_weights_scale, gemm2_weights, gemm2_weights_scale):
    compute = torch.promote_types(hidden_states_scale.dtype, torch.float32)
    out_dtype = torch.bfloat16 if routing_bias.dtype != torch.float64 else torch.float64
    tokens, hidden = hidden_states.shape
    x = (hidden_states.to(compute).view(tokens, hidden // BLOCK, BLOCK)
         * hidden_states_scale.to(compute)[:, :, None]).view(tokens, hidden)
    experts, weights, _ = _route(routing_logits, routing_bias, compute)
    out = torch.zeros(tokens, hidden, dtype=compute, device=x.device)
    for e in range(gemm1_weights.shape[0]):
        token_ids, slot = (experts == e + LOCAL_EXPERT_OFFSET).nonzero(as_tuple=True)
        if token_ids.numel() == 0:
            continue
        h = x[token_ids] @ _dequant(gemm1_weights[e], gemm1_weights_scale[e], compute).T
        gate, up = h.chunk(2, dim=-1)
        y = (torch.nn.functional.silu(gate) * up) @ _dequant(gemm2_weights[e], gemm2_weights_scale[e], compute).T
        out[token_ids] += y * weights[token_ids, slot, None]  # a token picks an expert at most once
    return out.to(out_dtype)
