"""Fused residual add + RMSNorm: s = x + residual (fp32), out = s * rsqrt(mean(s^2) + 1e-5) * weight over the last dim, rounded to bf16 once; returns out only (bf16 in, bf16 out)."""
# Source: Llama-3.1-8B config.json: hidden_size 4096, rms_norm_eps 1e-5 (RMSNorm with a learned
# per-channel weight, applied after adding the residual stream, as in every decoder layer).
# Original (MetaKernelBench p28, FlashInfer-Trace fused_add_rmsnorm_h4096): the same maths and
# workload; it returns only the normalised output (the updated residual is not an output).
# Semantics: the sum s = x + residual is taken in fp32; out = (s / sqrt(mean(s^2) + eps)) * weight,
# all in fp32, rounded to bf16 once.
# Workload: 14,509 tokens x 4096 (a long prefill batch). Fixed: shapes, eps.
# Redrawn per draw: x, residual ~ N(0, 1) (bf16); weight = 1 + 0.1 N(0, 1) rounded to bf16.
import torch

DTYPE = "bf16"
SOL = {"flops": 5 * 14509 * 4096, "bytes": 2 * (3 * 14509 * 4096 + 4096)}

EPS = 1e-5


def make_inputs(device="cuda", scale="full"):
    tokens, hidden = (14509, 4096) if scale == "full" else (37, 256)
    x = torch.randn(tokens, hidden, device=device, dtype=torch.bfloat16)
    residual = torch.randn(tokens, hidden, device=device, dtype=torch.bfloat16)
    weight = (1.0 + 0.1 * torch.randn(hidden, device=device)).to(torch.bfloat16)
    return [x, residual, weight]


def reference(x, residual, weight):
    compute = torch.promote_types(x.dtype, torch.float32)
    s = x.to(compute) + residual.to(compute)
    inv_rms = torch.rsqrt(s.pow(2).mean(dim=-1, keepdim=True) + EPS)
    return (s * inv_rms * weight.to(compute)).to(x.dtype)
