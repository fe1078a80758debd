"""Vision patch merger: per-patch LayerNorm (1536), 2x2 spatial merge of raster-ordered patches per image grid into 6144-wide tokens, then Linear 6144->6144, exact GELU, Linear 6144->3584 (bf16 in, bf16 out)."""
# Source: Qwen3-Omni's vision encoder, like the Qwen-VL family, ends with a patch merger
# (published semantics): LayerNorm over the ViT width (eps 1e-6), spatial_merge_size 2 (each 2x2
# block of neighbouring patches is concatenated), an MLP with exact (erf) GELU, and a projection to
# the language-model width. Dims as in the slot: ViT width 1536, merged 4 x 1536 = 6144, MLP
# 6144 -> 6144, output 3584.
# Workload: 32,768 patches of width 1536 from 8 image grids (t, h, w) = (1,64,64), (1,32,128),
# (1,128,32), (1,48,96), (1,96,40), (1,56,72), (1,72,56), (1,62,64) -> 8,192 merged tokens.
# Patches arrive in raster order per grid (row-major over h, w); the merge gathers each 2x2
# window, in window order (row-major over h/2, w/2), patch order inside a window (0,0),(0,1),(1,0),(1,1).
# Fixed: grid sizes (passed as an int64 tensor grid_thw [8, 3]), eps.
# Redrawn per draw: x (N(0,1)), LayerNorm weight (1 + 0.1 N) and bias (0.1 N), Linear weights
# (N(0,1)/sqrt(fan_in)) and biases (0.02 N).
import torch
import torch.nn.functional as F

DTYPE = "bf16"
SOL = {"flops": 2 * 8192 * 6144 * 6144 + 2 * 8192 * 6144 * 3584 + 8 * 32768 * 1536,
       "bytes": 2 * (32768 * 1536 + 2 * 1536 + 6144 * 6144 + 6144 + 3584 * 6144 + 3584 + 8192 * 3584) + 8 * 24}

_GRIDS_FULL = [(1, 64, 64), (1, 32, 128), (1, 128, 32), (1, 48, 96), (1, 96, 40), (1, 56, 72), (1, 72, 56),
               (1, 62, 64)]
_GRIDS_SMOKE = [(1, 4, 6), (1, 2, 8), (1, 6, 4)]


def make_inputs(device="cuda", scale="full"):
    if scale == "smoke":
        grids, c, m, o = _GRIDS_SMOKE, 48, 192, 64
    else:
        grids, c, m, o = _GRIDS_FULL, 1536, 6144, 3584
    n = sum(t * h * w for t, h, w in grids)
    bf = torch.bfloat16
    x = torch.randn(n, c, device=device, dtype=bf)
    ln_w = (1 + 0.1 * torch.randn(c, device=device)).to(bf)
    ln_b = (0.1 * torch.randn(c, device=device)).to(bf)
    w1 = (torch.randn(m, 4 * c, device=device) / (4 * c) ** 0.5).to(bf)
    b1 = (0.02 * torch.randn(m, device=device)).to(bf)
    w2 = (torch.randn(o, m, device=device) / m ** 0.5).to(bf)
    b2 = (0.02 * torch.randn(o, device=device)).to(bf)
    grid_thw = torch.tensor(grids, dtype=torch.int64, device=device)
    return [x, grid_thw, ln_w, ln_b, w1, b1, w2, b2]


def reference(x, grid_thw, ln_w, ln_b, w1, b1, w2, b2):
    ct = torch.promote_types(x.dtype, torch.float32)
    c = x.shape[-1]
    h = F.layer_norm(x.to(ct), (c,), ln_w.to(ct), ln_b.to(ct), eps=1e-6).to(x.dtype)
    merged, off = [], 0
    for t, gh, gw in grid_thw.tolist():
        n = t * gh * gw
        g = h[off:off + n].view(t, gh // 2, 2, gw // 2, 2, c)
        merged.append(g.permute(0, 1, 3, 2, 4, 5).reshape(-1, 4 * c))
        off += n
    z = torch.cat(merged, dim=0)
    z = F.gelu(F.linear(z, w1, b1))
    return F.linear(z, w2, b2)
