"""AltUp collapse: project altup streams 1..3 with their own 2048x2048 unembed matrices, rescale each projected token to the RMS magnitude of stream 0, and average with stream 0 (bf16 in, bf16 out)."""
# Source: Gemma 3n E2B (google/gemma-3n-E2B) text config: hidden_size 2048, altup_num_inputs 4,
# altup_active_idx 0. After the last layer the model collapses its 4 AltUp streams: stream 0 is
# kept; stream i = 1..3 goes through altup_unembed_projections[i-1] (Linear 2048 -> 2048, no
# bias), is rescaled per token by target / sqrt(max(mean(c^2), 1e-5)) where
# target = sqrt(mean(stream0^2)) (mean over the hidden dim), and the 4 streams are averaged.
# Magnitudes are computed here in fp32 (fp64 in the anchor), the projections in bf16.
# Workload: 64 x 256 tokens = 16,384 tokens, streams [4, 64, 256, 2048]. The slot's width 3072 is
# not a Gemma 3n E2B dimension; it is corrected to the model's hidden_size 2048.
# Fixed: shapes, eps. Redrawn per draw: streams (N(0,1) times a per-(stream, token) scale
# exp(0.5 N(0,1))), projections (N(0,1)/sqrt(2048)).
import torch

DTYPE = "bf16"
SOL = {"flops": 3 * 2 * 16384 * 2048 * 2048 + 20 * 16384 * 2048,
       "bytes": 2 * (4 * 16384 * 2048 + 3 * 2048 * 2048 + 16384 * 2048)}


def make_inputs(device="cuda", scale="full"):
    if scale == "smoke":
        b, s, d = 2, 8, 64
    else:
        b, s, d = 64, 256, 2048
    bf = torch.bfloat16
    streams = (torch.randn(4, b, s, d, device=device) * (0.5 * torch.randn(4, b, s, 1, device=device)).exp()).to(bf)
    unembed = (torch.randn(3, d, d, device=device) / d ** 0.5).to(bf)
    return [streams, unembed]


def reference(streams, unembed):
    ct = torch.promote_types(streams.dtype, torch.float32)
    n, b, s, d = streams.shape
    h0 = streams[0].to(ct)
    target = h0.pow(2).mean(-1, keepdim=True).sqrt()
    proj = torch.bmm(streams[1:].reshape(n - 1, b * s, d), unembed.transpose(1, 2)).to(ct)
    mag = proj.pow(2).mean(-1, keepdim=True).clamp_min(1e-5).sqrt()
    proj = proj * (target.reshape(1, b * s, 1) / mag)
    out = (h0 + proj.sum(0).reshape(b, s, d)) / n
    return out.to(streams.dtype)
