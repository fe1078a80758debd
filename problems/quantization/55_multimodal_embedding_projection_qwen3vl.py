"""Multimodal input embedding: gather bf16 token embeddings and overwrite every image-token position, in order, with an NVFP4 projection of the vision features (packed e2m1 uint8 + e4m3 block-16 scales + fp32 global scale, plus bf16 bias), returning bf16 [B,S,5120]."""
# Source: Qwen3-VL-32B config.json: text hidden_size 5120, vocab_size 151936, image_token_id
# 151655; vision tower hidden_size 1152 with spatial_merge_size 2, so the patch merger sees
# 4 * 1152 = 4608 features per merged token and its last linear (with bias) maps 4608 -> 5120
# (out_hidden_size). The language model's input is the token embedding, with the merged vision
# features scattered into the image_pad positions in reading order.
# NVFP4 (NVIDIA's 4-bit format): e2m1 codes {0, .5, 1, 1.5, 2, 3, 4, 6} with a sign bit, two per
# byte (low nibble = even element), one float8_e4m3fn scale per 16 consecutive elements along K,
# and one fp32 per-tensor global scale: value = e2m1 * block_scale * global_scale.
# Workload: 32 sequences x 1024 tokens, each holding one image of 384 merged tokens (a 16x24 grid)
# at a random offset: 12,288 vision rows projected 4608 -> 5120. Slot change: the slot lists hidden
# 8192 and vision width 3584, which are not Qwen3-VL values; we use Qwen3-VL-32B's 5120 and 4608.
# The embedding table stays bf16 (NVFP4 checkpoints do not quantize it); vision activations and the
# projection weight arrive already quantized (activations by the preceding fused fc1+GELU kernel).
# Semantics: out[b, s] = table[ids[b, s]] for text tokens; the n-th image_pad position (row-major
# over b, s) gets (dequant(vis) @ dequant(W)^T + bias)[n], computed in fp32, rounded to bf16.
# Fixed: shapes, image size, token id. Redrawn per draw: ids and image offsets, table, features,
# weight, bias.
import torch

DTYPE = "nvfp4"
SOL = {
    "flops": 2 * 12288 * 4608 * 5120 + 12288 * 5120,
    "bytes": 8 * 32 * 1024 + 2 * 20480 * 5120 + 12288 * 2304 + 12288 * 288 + 5120 * 2304
    + 5120 * 288 + 2 * 4 + 2 * 5120 + 2 * 32768 * 5120,
}

IMAGE_TOKEN_ID = 151655
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _e2m1_table(dtype, device):
    mag = torch.tensor(_E2M1, dtype=dtype, device=device)
    return torch.cat([mag, -mag])  # code = sign << 3 | magnitude index


def _dequant_nvfp4(packed, scale, global_scale, cdt):
    """packed [..., K/2] uint8, scale [..., K/16] e4m3, global_scale fp32 -> [..., K] in cdt."""
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2).long()
    vals = _e2m1_table(cdt, packed.device)[codes].unflatten(-1, (-1, 16))
    block = scale.to(cdt) * global_scale.to(cdt)
    return (vals * block[..., None]).flatten(-2)


def _quant_nvfp4(x, global_scale):
    """Round-to-nearest-even NVFP4 quantization of x [..., K] (used to build the inputs)."""
    xb = x.unflatten(-1, (-1, 16))
    scale = (xb.abs().amax(-1) / (6.0 * global_scale)).clamp(max=448.0).to(torch.float8_e4m3fn)
    denom = scale.to(x.dtype) * global_scale
    y = xb / torch.where(denom == 0, torch.ones_like(denom), denom)[..., None]
    a = y.abs()
    ties_down = torch.tensor([0.25, 1.25, 2.5, 5.0], dtype=a.dtype, device=a.device)
    ties_up = torch.tensor([0.75, 1.75, 3.5], dtype=a.dtype, device=a.device)
    idx = torch.bucketize(a, ties_down) + torch.bucketize(a, ties_up, right=True)
    codes = (idx + 8 * (y < 0)).to(torch.uint8).flatten(-2)
    return codes[..., 0::2] | (codes[..., 1::2] << 4), scale


def _quant_tensor(x):
    global_scale = x.abs().amax() / (6.0 * 448.0)
    packed, scale = _quant_nvfp4(x, global_scale)
    return packed, scale, global_scale


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        batch, seq, n_img, vocab, hidden, k = 32, 1024, 384, 151936, 5120, 4608
    else:
        batch, seq, n_img, vocab, hidden, k = 3, 40, 12, 151936, 64, 96
    ids = torch.randint(0, 151643, (batch, seq), device=device)  # ordinary (non-special) tokens
    offsets = torch.randint(0, seq - n_img + 1, (batch,), device=device)
    pos = torch.arange(seq, device=device)
    is_image = (pos >= offsets[:, None]) & (pos < offsets[:, None] + n_img)
    ids = torch.where(is_image, torch.full_like(ids, IMAGE_TOKEN_ID), ids)
    table = (0.02 * torch.randn(vocab, hidden, device=device)).to(torch.bfloat16)
    vis = torch.nn.functional.gelu(torch.randn(batch * n_img, k, device=device))
    w = torch.randn(hidden, k, device=device) / k ** 0.5
    vis_packed, vis_scale, vis_global = _quant_tensor(vis)
    w_packed, w_scale, w_global = _quant_tensor(w)
    bias = (0.02 * torch.randn(hidden, device=device)).to(torch.bfloat16)
    return [ids, table, vis_packed, vis_scale, vis_global, w_packed, w_scale, w_global, bias]


def reference(ids, table, vis_packed, vis_scale, vis_global, w_packed, w_scale, w_global, bias):
    cdt = torch.promote_types(bias.dtype, torch.float32)
    vis = _dequant_nvfp4(vis_packed, vis_scale, vis_global, cdt)
    w = _dequant_nvfp4(w_packed, w_scale, w_global, cdt)
    proj = torch.addmm(bias.to(cdt), vis, w.T).to(table.dtype)
    out = table[ids]
    out[ids == IMAGE_TOKEN_ID] = proj
    return out
