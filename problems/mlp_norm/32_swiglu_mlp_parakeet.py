"""SwiGLU MLP in fp32 without biases: h = x @ w_gate_up.T (gate = first 4096 columns, up = last 4096), out = (silu(gate) * up) @ w_down.T."""
# Source: NVIDIA Parakeet (FastConformer-XL encoder, ~0.6B): hidden size 1024, feed-forward
# intermediate size 4096 (expansion 4), SiLU activation.
# Original (MetaKernelBench p32): the gated (SwiGLU) form with one fused gate-up projection
# 1024 -> 8192 whose first 4096 outputs are the gate and last 4096 the up branch, then the down
# projection 4096 -> 1024; inputs (x, w_gate_up, w_down), no biases.
# Weights use the nn.Linear layout [out_features, in_features]. All fp32 (no TF32).
# Workload: batch 64 x 128 frames x 1024 (8,192 rows). Fixed: shapes.
# Redrawn per draw: x ~ N(0, 1); weights ~ N(0, 1/fan_in).
import torch

DTYPE = "fp32"
SOL = {
    "flops": 2 * 8192 * 1024 * 8192 + 2 * 8192 * 4096 * 1024 + 4 * 8192 * 4096,
    "bytes": 4 * (8192 * 1024 + 8192 * 1024 + 1024 * 4096 + 8192 * 1024),
}


def make_inputs(device="cuda", scale="full"):
    batch, frames, hidden, inter = (64, 128, 1024, 4096) if scale == "full" else (2, 8, 64, 96)
    x = torch.randn(batch, frames, hidden, device=device)
    w_gate_up = torch.randn(2 * inter, hidden, device=device) / hidden ** 0.5
    w_down = torch.randn(hidden, inter, device=device) / inter ** 0.5
    return [x, w_gate_up, w_down]


def reference(x, w_gate_up, w_down):
    gate, up = torch.nn.functional.linear(x, w_gate_up).chunk(2, dim=-1)
    return torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, w_down)
