"""RMSNorm over rows of width 128 (the per-head q/k norm), eps 1e-6: y = x * rsqrt(mean(x^2) + eps) * weight computed in fp32 and rounded to bf16 once (bf16 in, bf16 out)."""
# Source: Qwen3-30B-A3B config.json: head_dim 128, num_attention_heads 32, num_key_value_heads 4,
# rms_norm_eps 1e-6; Qwen3 applies RMSNorm per head to q and k before RoPE.
# Original (MetaKernelBench p36, FlashInfer-Trace rmsnorm_h128): the same workload and inputs;
# the weight multiplies the fp32 normalised value and the product is rounded to bf16 once.
# Workload: 520,128 rows x 128 (14,448 tokens x 36 heads flattened), one weight vector.
# Fixed: shapes, eps. Redrawn per draw: x (N(0,1), bf16), weight (1 + 0.1 N rounded to bf16).
import torch

DTYPE = "bf16"
SOL = {"flops": 4 * 520128 * 128,
       "bytes": 2 * (2 * 520128 * 128 + 128)}

EPS = 1e-6


def make_inputs(device="cuda", scale="full"):
    n = 72 if scale == "smoke" else 520128
    x = torch.randn(n, 128, device=device, dtype=torch.bfloat16)
    weight = (1 + 0.1 * torch.randn(128, device=device)).to(torch.bfloat16)
    return [x, weight]


def reference(x, weight):
    ct = torch.promote_types(x.dtype, torch.float32)
    h = x.to(ct)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
    return (h * weight.to(ct)).to(x.dtype)
