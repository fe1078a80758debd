"""MTP input block: shift token ids left by one (the last position gets id 0), embed them, RMSNorm the embedding and the previous hidden state separately (eps given), concatenate [emb, hidden] (8192) and project to 4096 (bf16 in, bf16 out)."""
# Source: Ling 2.0 (inclusionAI Ling-flash-2.0) config.json: hidden_size 4096, vocab_size 157184,
# rms_norm_eps 1e-6, num_nextn_predict_layers 1. Its multi-token-prediction layer follows the
# DeepSeek-V3 MTP design: h'_i = W_eh [RMSNorm_e(Emb(t_{i+1})); RMSNorm_h(h_i)], W_eh 4096 x 8192,
# no bias. RMSNorm: statistics in fp32, normalised value cast to bf16, times weight.
# Original (MetaKernelBench p42): inputs (input_ids, hidden_states, word_embeddings, enorm_weight,
# hnorm_weight, eh_proj_weight, eps); the ids are rolled left by one and the last position's id is
# set to 0 before the lookup (so it embeds token 0).
# Workload: 32 sequences x 256 tokens = 8,192 positions; embedding table 157,184 x 4096 bf16
# (1.3 GB; only the gathered rows are counted in SOL bytes).
# Fixed: shapes, eps 1e-6. Redrawn per draw: token ids (uniform over the vocabulary), hidden
# (N(0,1)), embedding table (N(0,1)), norm weights (1 + 0.1 N), W_eh (N(0,1)/sqrt(8192)).
import torch
import torch.nn.functional as F

DTYPE = "bf16"
SOL = {"flops": 2 * 8192 * 8192 * 4096 + 8 * 8192 * 8192,
       "bytes": 8 * 8192 + 2 * (8192 * 4096 + 8192 * 4096 + 2 * 4096 + 4096 * 8192 + 8192 * 4096)}

EPS = 1e-6


def make_inputs(device="cuda", scale="full"):
    if scale == "smoke":
        b, s, d, v = 2, 8, 64, 500
    else:
        b, s, d, v = 32, 256, 4096, 157184
    bf = torch.bfloat16
    input_ids = torch.randint(0, v, (b, s), device=device, dtype=torch.int64)
    hidden = torch.randn(b, s, d, device=device, dtype=bf)
    embed = torch.randn(v, d, device=device, dtype=bf)
    enorm_w = (1 + 0.1 * torch.randn(d, device=device)).to(bf)
    hnorm_w = (1 + 0.1 * torch.randn(d, device=device)).to(bf)
    w_eh = (torch.randn(d, 2 * d, device=device) / (2 * d) ** 0.5).to(bf)
    return [input_ids, hidden, embed, enorm_w, hnorm_w, w_eh, EPS]


def _rmsnorm(x, w, eps):
    ct = torch.promote_types(x.dtype, torch.float32)
    h = x.to(ct)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def reference(input_ids, hidden, embed, enorm_w, hnorm_w, w_eh, eps):
    shifted = torch.roll(input_ids, shifts=-1, dims=1)
    shifted[:, -1] = 0
    e = F.embedding(shifted, embed)
    z = torch.cat([_rmsnorm(e, enorm_w, eps), _rmsnorm(hidden, hnorm_w, eps)], dim=-1)
    return F.linear(z, w_eh)
