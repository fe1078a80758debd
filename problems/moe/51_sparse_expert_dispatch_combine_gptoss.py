"""gpt-oss sparse experts from given routing: top-4 expert ids per token and a dense [T, 128] routing-weight table, experts with interleaved gate/up projection + bias and clamped GLU ((up+1) * gate*sigmoid(1.702 gate), limit 7), down projection + bias, weighted combine (fp32)."""
# Source: gpt-oss-120b config.json: hidden_size 2880, num_local_experts 128, num_experts_per_tok 4,
# intermediate_size 2880, swiglu_limit 7.0; published expert semantics: gate_up projection
# [hidden -> 2 x 2880] with bias whose output columns alternate gate, up (gate = even columns,
# up = odd); gate clamped to <= 7, up to [-7, 7]; glu = gate * sigmoid(1.702 gate);
# h = (up + 1) * glu; down projection with bias. Weights as the model stores them:
# gate_up [E, 2880, 5760] and down [E, 2880, 2880], applied as h @ W (input dim first).
# Original (MetaKernelBench p51): inputs (hidden_states, router_indices [T, 4], routing_weights
# [T, 128], gate_up_proj, gate_up_proj_bias, down_proj, down_proj_bias); no router in the problem.
# Semantics: experts that appear in router_indices run one after another in id order on their
# tokens; out[t] = sum over t's 4 experts e of routing_weights[t, e] * expert_e(x[t]).
# Workload: 16,384 tokens, fp32 throughout (12.7 GB of fp32 expert weights; ~512 tokens per
# expert on average).
# Fixed: shapes, limit, alpha. Redrawn per draw: x (N(0,1)); router logits N(0,1) -> ids = their
# top-4, routing_weights = their softmax over all 128 experts (our reading of the recipe);
# gate_up weights 0.03 N(0,1) and biases 0.5 N(0,1) (as the original draws them); down weights
# N(0,1)/sqrt(2880) and biases 0.5 N(0,1).
import torch

DTYPE = "fp32"
SOL = {"flops": 2 * 16384 * 4 * 2880 * (5760 + 2880) + 10 * 16384 * 4 * 2880,
       "bytes": 4 * (16384 * 2880 + 16384 * 128 + 128 * 2880 * 5760 + 128 * 5760 + 128 * 2880 * 2880
                     + 128 * 2880 + 16384 * 2880) + 8 * 16384 * 4}

TOP_K = 4
LIMIT = 7.0
ALPHA = 1.702


def make_inputs(device="cuda", scale="full"):
    t, d, e, f = (48, 32, 16, 32) if scale == "smoke" else (16384, 2880, 128, 2880)
    x = torch.randn(t, d, device=device)
    logits = torch.randn(t, e, device=device)
    router_indices = logits.topk(TOP_K, dim=-1).indices
    routing_weights = torch.softmax(logits, dim=-1)
    w_gate_up = 0.03 * torch.randn(e, d, 2 * f, device=device)
    b_gate_up = 0.5 * torch.randn(e, 2 * f, device=device)
    w_down = torch.randn(e, f, d, device=device) / f ** 0.5
    b_down = 0.5 * torch.randn(e, d, device=device)
    return [x, router_indices, routing_weights, w_gate_up, b_gate_up, w_down, b_down]


def reference(x, router_indices, routing_weights, w_gate_up, b_gate_up, w_down, b_down):
    out = torch.zeros_like(x)
    for e in torch.unique(router_indices).tolist():
        tok = (router_indices == e).any(dim=-1).nonzero().squeeze(1)
        z = x[tok] @ w_gate_up[e] + b_gate_up[e]
        gate = z[:, 0::2].clamp(max=LIMIT)
        up = z[:, 1::2].clamp(min=-LIMIT, max=LIMIT)
        h = (up + 1) * (gate * torch.sigmoid(gate * ALPHA))
        y = h @ w_down[e] + b_down[e]
        out.index_add_(0, tok, y * routing_weights[tok, e, None])  # a token picks an expert at most once
    return out
