"""RMSNorm over rows of width 128 (the per-head q/k norm), eps 1e-6, fp32 statistics, output = weight * normalized cast back to bf16 (bf16 in, bf16 out)."""
# Source: Qwen3-30B-A3B config.json: head_dim 128, num_attention_heads 32, num_key_value_heads 4,
# rms_norm_eps 1e-6; Qwen3 applies RMSNorm per head to q and k before RoPE (statistics in fp32,
# the normalised value cast to the activation dtype, then times the weight).
# Workload: 520,128 rows x 128 = 14,448 tokens x 36 heads (32 q + 4 k) flattened, one weight
# vector (as the slot poses it).
# Fixed: shapes, eps. Redrawn per draw: x (N(0,1) times a per-row scale exp(N(0,1)), so rows have
# different magnitudes), weight (1 + 0.1 N).
import torch

DTYPE = "bf16"
SOL = {"flops": 4 * 520128 * 128,
       "bytes": 2 * (2 * 520128 * 128 + 128)}


def make_inputs(device="cuda", scale="full"):
    n = 72 if scale == "smoke" else 520128
    bf = torch.bfloat16
    x = (torch.randn(n, 128, device=device) * torch.randn(n, 1, device=device).exp()).to(bf)
    weight = (1 + 0.1 * torch.randn(128, device=device)).to(bf)
    return [x, weight]


def reference(x, weight):
    ct = torch.promote_types(x.dtype, torch.float32)
    h = x.to(ct)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    return weight * h.to(x.dtype)
