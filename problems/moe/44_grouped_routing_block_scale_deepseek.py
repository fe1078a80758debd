"""DeepSeek-V3 MoE layer on one expert-parallel rank: sigmoid grouped top-8 routing (8 groups, top-4 groups, bias, scaling factor given) then FP8 block-scaled (128x128) SwiGLU experts at the given local offset (gemm1 rows: up first, then gate); bf16 out [tokens, 7168]."""
# Source: DeepSeek-V3 config.json: hidden_size 7168, moe_intermediate_size 2048, n_routed_experts
# 256, num_experts_per_tok 8, n_group 8, topk_group 4, scoring_func sigmoid, topk_method noaux_tc
# (e_score_correction_bias), norm_topk_prob true, routed_scaling_factor 2.5; FP8 e4m3 weights with
# 128x128 block scales and activations with per-token, per-128-channel scales.
# Original (MetaKernelBench p44, FlashInfer-Trace moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_
# h7168_i2048): inputs (routing_logits fp32 [T, 256], routing_bias bf16 [256], hidden_states fp8
# [T, 7168], hidden_states_scale fp32 [56, T] (block-major), gemm1_weights fp8 [32, 4096, 7168],
# gemm1_weights_scale fp32 [32, 32, 56], gemm2_weights fp8 [32, 7168, 2048], gemm2_weights_scale
# fp32 [32, 56, 16], local_expert_offset 32, routed_scaling_factor 2.5); 14,107 tokens; the
# captured bias (4.9375, and 4.96875 for the experts listed below) and logit moments.
# Routing (all tokens, all 256 experts): s = sigmoid(logits); b = s + bias; group score = sum of
# the two largest b in each group of 32; keep the 4 best groups; choose the 8 largest b among them;
# weight_e = scale * s_e / (sum of the chosen s + 1e-20).
# Experts (this rank holds experts offset .. offset + 31): h = x @ W1[e].T with W1 rows 0..2047 the
# up projection and 2048..4095 the gate; a = silu(gate) * up; y = a @ W2[e].T; out[t] = sum over
# t's local experts of weight * y. Everything dequantized (fp8 value * its block scale) and
# computed in fp32; out rounded to bf16 once.
# Workload: 14,107 tokens; ~14,107 routed (token, local expert) pairs on average.
# Fixed: shapes, routing constants, bias. Redrawn per draw: logits ~ N(-1.6706, 0.6560^2) rounded
# to the bf16 grid (fp32 tensor), rows redrawn (up to 16 times) until every token's routing margins
# (4th vs 5th group score, 8th vs 9th eligible expert) are >= 1e-4; fp8 values N(0,1); block
# scales U(0, 1).
import torch

DTYPE = "fp8"
MARGIN = 1e-4
SOL = {
    "flops": 2 * 14107 * (4096 * 7168 + 7168 * 2048),
    "bytes": 4 * 14107 * 256 + 2 * 256 + 14107 * 7168 + 4 * 14107 * 56 + 32 * 4096 * 7168 + 4 * 32 * 32 * 56
    + 32 * 7168 * 2048 + 4 * 32 * 56 * 16 + 2 * 14107 * 7168,
}

N_EXPERTS, N_LOCAL, N_GROUP, TOPK_GROUP, TOP_K, BLOCK = 256, 32, 8, 4, 8, 128
LOCAL_EXPERT_OFFSET = 32
ROUTED_SCALING = 2.5
LOGIT_MEAN, LOGIT_STD = -1.6706, 0.6560
BIAS_BASE, BIAS_HIGH = 4.9375, 4.96875
BIAS_HIGH_EXPERTS = (
    3, 6, 7, 9, 10, 11, 16, 17, 18, 23, 30, 31, 36, 37, 41, 42, 43, 44, 46, 47, 48, 49, 54, 55, 56, 58, 61, 62,
    63, 66, 67, 68, 69, 72, 74, 75, 79, 80, 81, 82, 83, 84, 87, 90, 92, 96, 100, 101, 102, 104, 105, 108, 109,
    110, 112, 114, 119, 120, 123, 125, 126, 127, 131, 136, 147, 151, 152, 153, 154, 157, 159, 167, 170, 171,
    174, 183, 185, 195, 196, 197, 200, 203, 214, 216, 217, 219, 222, 223, 226, 230, 231, 234, 235, 236, 237,
    238, 240, 241, 242, 243, 253)
REDRAWS = 16


def _route(routing_logits, routing_bias, compute):
    """Chosen experts [T, 8], their scores s [T, 8] and each token's decision margin [T]."""
    scores = torch.sigmoid(routing_logits.to(compute))
    biased = scores + routing_bias.to(compute)
    tokens = scores.shape[0]
    group_scores = biased.view(tokens, N_GROUP, -1).topk(2, dim=-1).values.sum(dim=-1)
    ranked_groups = group_scores.sort(dim=-1, descending=True)
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, ranked_groups.indices[:, :TOPK_GROUP], True)
    eligible = biased.masked_fill(~keep.repeat_interleave(N_EXPERTS // N_GROUP, dim=1), torch.finfo(torch.float32).min)
    best = eligible.topk(TOP_K + 1, dim=-1)
    experts = best.indices[:, :TOP_K]
    group_gap = ranked_groups.values[:, TOPK_GROUP - 1] - ranked_groups.values[:, TOPK_GROUP]
    expert_gap = best.values[:, TOP_K - 1] - best.values[:, TOP_K]
    return experts, scores.gather(1, experts), torch.minimum(group_gap, expert_gap)


def _logits(rows, device):
    return (torch.randn(rows, N_EXPERTS, device=device) * LOGIT_STD + LOGIT_MEAN).to(torch.bfloat16).float()


def _fp8(shape, device):
    return torch.randn(shape, device=device).to(torch.float8_e4m3fn)


def make_inputs(device="cuda", scale="full"):
    tokens, hidden, inter = (14107, 7168, 2048) if scale == "full" else (64, 256, 128)
    routing_bias = torch.full((N_EXPERTS,), BIAS_BASE, dtype=torch.bfloat16)
    routing_bias[list(BIAS_HIGH_EXPERTS)] = BIAS_HIGH
    routing_bias = routing_bias.to(device)
    routing_logits = _logits(tokens, device)
    for _ in range(REDRAWS):
        bad = _route(routing_logits, routing_bias, torch.float64)[2] < MARGIN
        if not bool(bad.any()):
            break
        routing_logits[bad] = _logits(int(bad.sum()), device)
    else:
        raise ValueError(f"routing margins under {MARGIN} persist after {REDRAWS} redraws")
    hidden_states = _fp8((tokens, hidden), device)
    hidden_states_scale = torch.rand(hidden // BLOCK, tokens, device=device)
    gemm1_weights = _fp8((N_LOCAL, 2 * inter, hidden), device)
    gemm1_weights_scale = torch.rand(N_LOCAL, 2 * inter // BLOCK, hidden // BLOCK, device=device)
    gemm2_weights = _fp8((N_LOCAL, hidden, inter), device)
    gemm2_weights_scale = torch.rand(N_LOCAL, hidden // BLOCK, inter // BLOCK, device=device)
    return [routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale,
            gemm2_weights, gemm2_weights_scale, LOCAL_EXPERT_OFFSET, ROUTED_SCALING]


def decision_margin(routing_logits, routing_bias, *rest):
    return float(_route(routing_logits, routing_bias, torch.float64)[2].min())


def _dequant(weight, scale, compute):
    rows, cols = weight.shape
    blocks = weight.to(compute).view(rows // BLOCK, BLOCK, cols // BLOCK, BLOCK) * scale.to(compute)[:, None, :, None]
    return blocks.view(rows, cols)


def reference(routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale,
              gemm2_weights, gemm2_weights_scale, local_expert_offset, routed_scaling_factor):
    compute = torch.promote_types(routing_logits.dtype, torch.float32)
    tokens, hidden = hidden_states.shape
    x = (hidden_states.to(compute).view(tokens, hidden // BLOCK, BLOCK)
         * hidden_states_scale.to(compute).t()[:, :, None]).view(tokens, hidden)
    experts, chosen, _ = _route(routing_logits, routing_bias, compute)
    weights = chosen / (chosen.sum(dim=-1, keepdim=True) + 1e-20) * routed_scaling_factor
    out = torch.zeros(tokens, hidden, dtype=compute, device=x.device)
    for e in range(gemm1_weights.shape[0]):
        token_ids, slot = (experts == e + local_expert_offset).nonzero(as_tuple=True)
        if token_ids.numel() == 0:
            continue
        h = x[token_ids] @ _dequant(gemm1_weights[e], gemm1_weights_scale[e], compute).T
        up, gate = h.chunk(2, dim=-1)
        y = (torch.nn.functional.silu(gate) * up) @ _dequant(gemm2_weights[e], gemm2_weights_scale[e], compute).T
        out.index_add_(0, token_ids, y * weights[token_ids, slot, None])  # a token picks an expert at most once
    return out.to(routing_bias.dtype)
