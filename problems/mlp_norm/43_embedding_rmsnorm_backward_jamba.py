"""Backward of y = RMSNorm(Embedding(ids)) * weight from the saved fp32 embedding output and rstd: given dL/dy (bf16), ids, the embeddings h (fp32), rstd (fp32 [B,S,1]) and weight, return (dL/dtable as a dense [vocab, hidden] bf16 tensor accumulated over repeated ids, dL/dweight bf16)."""
# Source: Jamba-v0.1 (ai21labs) config.json: vocab_size 65536, hidden_size 4096, rms_norm_eps 1e-6;
# the token embedding feeds the first layer's input RMSNorm.
# Original (MetaKernelBench p43): inputs (grad_output, input_ids, hidden_states_fp32, rstd,
# norm_weight), 2 outputs; the embedding output and its rstd are saved, not recomputed.
# Semantics (fp32, fp64 in the anchor): x_hat = h * rstd; dweight = sum over tokens of dy * x_hat;
# g = dy * weight; dh = rstd * (g - x_hat * mean(g * x_hat)); dtable = zeros, index-added with dh at
# each token's id; both gradients rounded to bf16.
# Workload: 64 sequences x 256 tokens = 16,384 tokens; vocab 65,536 x 4096 (the dense table
# gradient is 0.5 GB, mostly zero rows).
# Fixed: shapes, eps 1e-6 (used to build rstd). Redrawn per draw: dy (N(0,1), bf16), token ids
# (uniform over the vocabulary), h (N(0,1), fp32), rstd = 1 / sqrt(mean(h^2) + 1e-6), weight
# (1 + 0.1 N, bf16).
import torch

DTYPE = "bf16"
VOCAB = 65536
SOL = {"flops": 12 * 16384 * 4096,
       "bytes": 2 * 16384 * 4096 + 8 * 16384 + 4 * 16384 * 4096 + 4 * 16384 + 2 * 4096
       + 2 * 65536 * 4096 + 2 * 4096}


def make_inputs(device="cuda", scale="full"):
    if scale == "smoke":
        b, s, d = 2, 16, 64
    else:
        b, s, d = 64, 256, 4096
    bf = torch.bfloat16
    grad_y = torch.randn(b, s, d, device=device, dtype=bf)
    ids = torch.randint(0, VOCAB, (b, s), device=device, dtype=torch.int64)
    hidden = torch.randn(b, s, d, device=device)
    rstd = torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + 1e-6)
    weight = (1 + 0.1 * torch.randn(d, device=device)).to(bf)
    return [grad_y, ids, hidden, rstd, weight]


def reference(grad_y, ids, hidden, rstd, weight):
    ct = torch.promote_types(grad_y.dtype, torch.float32)
    d = hidden.shape[-1]
    dy = grad_y.to(ct)
    x_hat = hidden.to(ct) * rstd.to(ct)
    grad_w = (dy * x_hat).sum(dim=(0, 1))
    g = dy * weight.to(ct)
    dh = rstd.to(ct) * (g - x_hat * (g * x_hat).mean(-1, keepdim=True))
    # a deterministic (sort-based) scatter-add of the token gradients into the table's rows
    grad_table = torch.ops.aten.embedding_dense_backward(dh.reshape(-1, d), ids.reshape(-1), VOCAB, -1, False)
    return grad_table.to(grad_y.dtype), grad_w.to(grad_y.dtype)
