"""SwiGLU MLP in fp32: h = x @ w_gate_up.T + b_gate_up (gate = first 4096 columns, up = last 4096), out = (silu(gate) * up) @ w_down.T + b_down."""
# Source: NVIDIA Parakeet (FastConformer-XL encoder, ~0.6B): hidden size 1024, feed-forward
# intermediate size 4096 (expansion 4), SiLU activation, linear layers with bias.
# The slot's gated (SwiGLU) form is used: one fused gate-up projection 1024 -> 8192 whose first
# 4096 outputs are the gate and last 4096 the up branch, then the down projection 4096 -> 1024.
# Weights use the nn.Linear layout [out_features, in_features]. All fp32 (no TF32).
# Workload: batch 64 x 128 frames x 1024 (8,192 rows). Fixed: shapes.
# Redrawn per draw: x ~ N(0, 1); weights ~ N(0, 1/fan_in); biases ~ 0.1 N(0, 1).
import torch

DTYPE = "fp32"
SOL = {
    "flops": 2 * 8192 * 1024 * 8192 + 2 * 8192 * 4096 * 1024 + 4 * 8192 * 4096,
    "bytes": 4 * (8192 * 1024 + 8192 * 1024 + 8192 + 1024 * 4096 + 1024 + 8192 * 1024),
}


def make_inputs(device="cuda", scale="full"):
    batch, frames, hidden, inter = (64, 128, 1024, 4096) if scale == "full" else (2, 8, 64, 96)
    x = torch.randn(batch, frames, hidden, device=device)
    w_gate_up = torch.randn(2 * inter, hidden, device=device) / hidden ** 0.5
    b_gate_up = 0.1 * torch.randn(2 * inter, device=device)
    w_down = torch.randn(hidden, inter, device=device) / inter ** 0.5
    b_down = 0.1 * torch.randn(hidden, device=device)
    return [x, w_gate_up, b_gate_up, w_down, b_down]


def reference(x, w_gate_up, b_gate_up, w_down, b_down):
    h = torch.nn.functional.linear(x, w_gate_up, b_gate_up)
    gate, up = h.chunk(2, dim=-1)
    return torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, w_down, b_down)
