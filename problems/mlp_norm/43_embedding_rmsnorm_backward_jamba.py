"""Backward of y = RMSNorm(Embedding(ids)) * weight (eps 1e-6): given ids, the table, weight and dL/dy, return (dL/dtable as a dense [vocab, hidden] tensor accumulated over repeated ids, dL/dweight) (bf16)."""
# Source: Jamba-v0.1 (ai21labs) config.json: vocab_size 65536, hidden_size 4096, rms_norm_eps 1e-6;
# the token embedding feeds the first layer's input RMSNorm. Gradients are accumulated in fp32
# (fp64 in the anchor) and returned in the parameter dtype (bf16), as autograd does for bf16
# parameters.
# Workload: 64 sequences x 256 tokens = 16,384 tokens; vocab 65,536 x 4096 (the dense table
# gradient is 0.5 GB, mostly zero rows).
# Fixed: shapes, eps. Redrawn per draw: token ids (uniform, except that ~25% of the tokens are
# drawn from 64 frequent ids, so many rows collect several contributions), table (N(0,1)),
# weight (1 + 0.1 N), grad_y (N(0,1)).
import torch

DTYPE = "bf16"
SOL = {"flops": 12 * 16384 * 4096,
       "bytes": 8 * 16384 + 2 * (16384 * 4096 + 4096 + 16384 * 4096 + 65536 * 4096 + 4096)}


def make_inputs(device="cuda", scale="full"):
    if scale == "smoke":
        b, s, d, v = 2, 16, 64, 256
    else:
        b, s, d, v = 64, 256, 4096, 65536
    bf = torch.bfloat16
    ids = torch.randint(0, v, (b, s), device=device, dtype=torch.int64)
    frequent = torch.randperm(v, device=device)[:64]
    pick = frequent[torch.randint(0, 64, (b, s), device=device)]
    ids = torch.where(torch.rand(b, s, device=device) < 0.25, pick, ids)
    table = torch.randn(v, d, device=device, dtype=bf)
    weight = (1 + 0.1 * torch.randn(d, device=device)).to(bf)
    grad_y = torch.randn(b, s, d, device=device, dtype=bf)
    return [ids, table, weight, grad_y]


def reference(ids, table, weight, grad_y):
    ct = torch.promote_types(table.dtype, torch.float32)
    d = table.shape[1]
    flat = ids.reshape(-1)
    e = table[flat].to(ct)
    rstd = torch.rsqrt(e.pow(2).mean(-1, keepdim=True) + 1e-6)
    ehat = e * rstd
    dy = grad_y.reshape(-1, d).to(ct)
    grad_weight = (dy * ehat).sum(0)
    g = dy * weight.to(ct)
    de = rstd * (g - ehat * (g * ehat).mean(-1, keepdim=True))
    grad_table = torch.ops.aten.embedding_dense_backward(de, flat, table.shape[0], -1, False)
    return grad_table.to(table.dtype), grad_weight.to(weight.dtype)
