"""Vision patch merger: per-patch LayerNorm (1536, eps given), 2x2 spatial merge of raster-ordered patches per image grid into 6144-wide tokens, then Linear 6144->6144, exact GELU, Linear 6144->3584 (bf16 in, bf16 out)."""
# Source: Qwen3-Omni's vision encoder, like the Qwen-VL family, ends with a patch merger
# (published semantics): LayerNorm over the ViT width, spatial_merge_size 2 (each 2x2 block of
# neighbouring patches is concatenated), an MLP with exact (erf) GELU, and a projection to the
# language-model width. Original (MetaKernelBench p27): ViT width 1536, merged 4 x 1536 = 6144,
# MLP 6144 -> 6144 -> 3584, 32,768 patches in 8 image grids, eps passed as the last argument.
# Workload: 8 grids (t, h, w) = (1, 64, 64) (4,096 patches each, as the original splits 32,768
# patches evenly into square grids), 8,192 merged tokens. Patches arrive in raster order per grid
# (row-major over h, w); the merge takes each 2x2 window in window order (row-major over h/2,
# w/2), patch order inside a window (0,0), (0,1), (1,0), (1,1).
# Semantics: LayerNorm statistics and affine in fp32, rounded to bf16; the Linears and GELU run in
# bf16 (PyTorch's bf16 GEMMs accumulate in fp32).
# Fixed: grid sizes (an int64 tensor grid_thw [8, 3]), eps 1e-6. Redrawn per draw: x (N(0,1) plus a
# per-patch offset 0.5 N(0,1)), LayerNorm weight (1 + 0.1 N) and bias (0.1 N), Linear weights
# (N(0,1)/sqrt(fan_in)) and biases (0.02 N).
import torch
import torch.nn.functional as F

DTYPE = "bf16"
SOL = {"flops": 2 * 8192 * 6144 * 6144 + 2 * 8192 * 6144 * 3584 + 8 * 32768 * 1536,
       "bytes": 2 * (32768 * 1536 + 2 * 1536 + 6144 * 6144 + 6144 + 3584 * 6144 + 3584 + 8192 * 3584) + 8 * 24}

EPS = 1e-6


def make_inputs(device="cuda", scale="full"):
    if scale == "smoke":
        grids, c, m, o = [(1, 4, 6), (1, 2, 8), (1, 6, 4)], 48, 192, 64
    else:
        grids, c, m, o = [(1, 64, 64)] * 8, 1536, 6144, 3584
    n = sum(t * h * w for t, h, w in grids)
    bf = torch.bfloat16
    x = (torch.randn(n, c, device=device) + 0.5 * torch.randn(n, 1, device=device)).to(bf)
    ln_w = (1 + 0.1 * torch.randn(c, device=device)).to(bf)
    ln_b = (0.1 * torch.randn(c, device=device)).to(bf)
    w1 = (torch.randn(m, 4 * c, device=device) / (4 * c) ** 0.5).to(bf)
    b1 = (0.02 * torch.randn(m, device=device)).to(bf)
    w2 = (torch.randn(o, m, device=device) / m ** 0.5).to(bf)
    b2 = (0.02 * torch.randn(o, device=device)).to(bf)
    grid_thw = torch.tensor(grids, dtype=torch.int64, device=device)
    return [x, grid_thw, ln_w, ln_b, w1, b1, w2, b2, EPS]


def reference(x, grid_thw, ln_w, ln_b, w1, b1, w2, b2, eps):
    ct = torch.promote_types(x.dtype, torch.float32)
    c = x.shape[-1]
    h = F.layer_norm(x.to(ct), (c,), ln_w.to(ct), ln_b.to(ct), eps=eps).to(x.dtype)
    merged, off = [], 0
    for t, gh, gw in grid_thw.tolist():
        n = t * gh * gw
        g = h[off:off + n].view(t, gh // 2, 2, gw // 2, 2, c)
        merged.append(g.permute(0, 1, 3, 2, 4, 5).reshape(-1, 4 * c))
        off += n
    z = torch.cat(merged, dim=0)
    z = F.gelu(F.linear(z, w1, b1))
    return F.linear(z, w2, b2)
