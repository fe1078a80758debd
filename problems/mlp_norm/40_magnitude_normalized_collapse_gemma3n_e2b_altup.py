"""AltUp collapse: project altup streams 1 and 2 with their own 3072x3072 unembed matrices (in fp32), rescale each projected token to the RMS magnitude of stream 0 (eps given), and average the 3 streams (bf16 in, bf16 out)."""
# Source: Gemma 3n (google/gemma-3n-E2B) collapses its AltUp streams after the last layer: stream 0
# is kept; stream i >= 1 goes through altup_unembed_projections[i-1] (Linear, no bias), is
# rescaled per token by target / sqrt(max(mean(c^2), eps)) with target = sqrt(mean(stream0^2))
# (means over the hidden dim), and the streams are averaged.
# Original (MetaKernelBench p40): 3 altup streams [3, 64, 256, 3072] (hidden 3072), two unembed
# matrices passed separately, eps 1e-5 as the last argument; magnitudes and projections in fp32.
# Workload: 64 x 256 tokens = 16,384 tokens, streams [3, 64, 256, 3072] bf16.
# Fixed: shapes, eps. Redrawn per draw: streams (N(0,1)), both projections (N(0,1), unscaled, as
# the original draws them: the rescaling makes the projection's scale irrelevant).
import torch

DTYPE = "bf16"
SOL = {"flops": 2 * 2 * 16384 * 3072 * 3072 + 20 * 16384 * 3072,
       "bytes": 2 * (3 * 16384 * 3072 + 2 * 3072 * 3072 + 16384 * 3072)}

EPS = 1e-5


def make_inputs(device="cuda", scale="full"):
    b, s, d = (2, 8, 64) if scale == "smoke" else (64, 256, 3072)
    bf = torch.bfloat16
    streams = torch.randn(3, b, s, d, device=device, dtype=bf)
    unembed_1 = torch.randn(d, d, device=device, dtype=bf)
    unembed_2 = torch.randn(d, d, device=device, dtype=bf)
    return [streams, unembed_1, unembed_2, EPS]


def reference(streams, unembed_1, unembed_2, eps):
    ct = torch.promote_types(streams.dtype, torch.float32)
    h0 = streams[0].to(ct)
    target = h0.pow(2).mean(-1, keepdim=True).sqrt()
    total = h0.clone()
    for i, w in enumerate((unembed_1, unembed_2), start=1):
        proj = streams[i].to(ct) @ w.to(ct).T
        mag = proj.pow(2).mean(-1, keepdim=True).clamp_min(eps).sqrt()
        total += proj * (target / mag)
    return (total / 3).to(streams.dtype)
