"""CPU model of the NVFP4 solutions' arithmetic (p55, p59, p61), and of the reference as torch runs it on a GPU.

The judge's reference runs on the H200, where torch differs from its CPU build in one operation these
problems use: a CUDA tensor divided by a Python number is multiplied by the number's reciprocal rounded
to the op's math type (aten BinaryDivTrueKernel.cu, "a * reciprocal(b)"), so `amax16 / 6.0` is
fl(amax16 * fl32(1/6)) on the GPU and an IEEE division on the CPU (they differ for about a third of the
bf16 values). `2688.0 / amax` is `amax.reciprocal() * 2688` on both (torch's Tensor.__rtruediv__).
`cuda_division()` puts the GPU rule on the CPU, so the problem's own `_nvfp4_quantize` can be compared
bit for bit with `kernel_quantize`, the solutions' quantization kernel written out in fp32 torch ops.

The GEMMs are modelled as the tensor cores accumulate them: per k16 step, the exact dot product of the
step's 16 bf16 products is added to the fp32 accumulator and the sum rounded to nearest ("rn") or cut
towards zero ("rz", the pessimistic model of tests/p49_model.py); the epilogue multiplies the accumulator
by fl(activation global * weight global) once; p59 keeps the product in fp32, p55 and p61 round it to bf16 once.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

import numerics  # noqa: E402  (tests/: the replays' shared loader and tolerance ratio)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from p49_model import _to_fp32  # noqa: E402  (fp32 rounding: "rn" or cut towards zero)

F32, F64 = torch.float32, torch.float64
INV6 = 0.1666666716337204                     # fp32(1 / 6), as the kernels and CUDA torch use it
ENCODE_NUM = 448.0 * 6.0
_DIVISIONS = {torch.Tensor.__truediv__, torch.Tensor.div, torch.div, torch.true_divide}


class cuda_division(TorchFunctionMode):
    """Context: `tensor / python_number` as torch computes it on CUDA (times the reciprocal in the math type)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (func in _DIVISIONS and len(args) == 2 and not kwargs and isinstance(args[1], (int, float))
                and torch.is_tensor(args[0]) and args[0].is_floating_point()):
            math = F64 if args[0].dtype == F64 else F32
            inv = float(torch.tensor(1.0, dtype=math) / torch.tensor(float(args[1]), dtype=math))
            return args[0] * inv
        return func(*args, **kwargs)


load_problem = numerics.load_problem


def _twice_e2m1(y: torch.Tensor) -> torch.Tensor:
    """The kernels' select chain: 2 * e2m1(|y|) with ties 0.25, 1.25, 2.5, 5 down and 0.75, 1.75, 3.5 up."""
    mag = torch.where(y < 0, -y, y)
    t = torch.zeros_like(mag)
    for bound, twice, up in ((0.25, 1.0, False), (0.75, 2.0, True), (1.25, 3.0, False), (1.75, 4.0, True),
                             (2.5, 6.0, False), (3.5, 8.0, True), (5.0, 12.0, False)):
        t = torch.where(mag >= bound if up else mag > bound, torch.full_like(mag, twice), t)
    return torch.where(y < 0, -t, t)


def kernel_quantize(t: torch.Tensor):
    """The AbsMax + Nvfp4Quant kernels on t [R, K] (bf16): (bf16 e2m1 * block_scale [R, K], e4m3 block scales
    as fp32 [R, K/16], fp32 global decode scale). The same fp32 operations in the same order; a TIRx
    division (fp64, rounded once) is the IEEE fp32 division torch does here."""
    y = t.to(F32)
    amax = y.abs().amax()
    encode = (torch.tensor(1.0, dtype=F32) / amax) * ENCODE_NUM if amax > 0 else torch.tensor(1.0, dtype=F32)
    blocks = y.unflatten(-1, (-1, 16))
    raw = torch.clamp(blocks.abs().amax(-1) * INV6 * encode, max=448.0)
    sf = raw.to(torch.float8_e4m3fn).to(F32)
    factor = torch.where(sf > 0, encode / sf, torch.zeros_like(sf))
    twice = _twice_e2m1(blocks * factor[..., None])
    values = (twice * (sf * 0.5)[..., None]).flatten(-2).to(torch.bfloat16)
    return values, sf, torch.tensor(1.0, dtype=F32) / encode


def decode(problem, packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The Nvfp4Decode kernel: e2m1 * block_scale, exact in bf16."""
    return problem._nvfp4_dequantize(packed, scale, torch.ones((), dtype=F32), F32).to(torch.bfloat16)


def gemm(a: torch.Tensor, b: torch.Tensor, rounding: str) -> torch.Tensor:
    """fp32 accumulator of bf16 a [M, K] @ b [N, K]^T, one exact k16 step at a time (fp64 result)."""
    a64, b64 = a.to(F64), b.to(F64)
    acc = torch.zeros(a.shape[0], b.shape[0], dtype=F64)
    for k0 in range(0, a.shape[1], 16):
        acc = _to_fp32(acc + a64[:, k0:k0 + 16] @ b64[:, k0:k0 + 16].T, rounding)
    return acc


def epilogue(acc: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """bf16(fp32(acc) * g), g an fp32 scalar or one per output column."""
    return (acc.to(F32) * g).to(torch.bfloat16)


def solve_p61(problem, inputs, rounding: str = "rn") -> torch.Tensor:
    """What the p61 kernels return (both DSLs: same order, same roundings). The weights' global decode scales
    are Python floats, rounded to fp32 on the way in (tvm-ffi, TVM's packed entry); the fused [gate | up]
    GEMM scales its gate columns by fl(x_global * gate_global) and its up columns by fl(x_global * up_global)."""
    x, gp, gs, gg, upk, us, ug, dp, ds, dg = inputs
    x2 = x.reshape(-1, x.shape[-1])
    a, _, gx = kernel_quantize(x2)
    inter = gp.shape[0]
    gw = torch.cat([torch.full((inter,), gg, dtype=F32), torch.full((inter,), ug, dtype=F32)])
    gu = epilogue(gemm(a, torch.cat([decode(problem, gp, gs), decode(problem, upk, us)]), rounding), gx * gw)
    g, u = gu[:, :inter].to(F32), gu[:, inter:].to(F32)
    silu = (g / (1.0 + torch.exp(-g))).to(torch.bfloat16).to(F32)
    h = (silu * u).to(torch.bfloat16)
    ah, _, gh = kernel_quantize(h)
    return epilogue(gemm(ah, decode(problem, dp, ds), rounding), gh * torch.tensor(dg, dtype=F32)).view(x.shape)


def solve_p55(problem, inputs, rounding: str = "rn") -> torch.Tensor:
    """What the p55 kernels return: the row map, the gather and the scatter GEMM."""
    ids, table, features, wp, ws, wg, bias, mask = inputs
    a, _, gx = kernel_quantize(features.reshape(-1, features.shape[-1]))
    w = decode(problem, wp, ws)
    vision = epilogue(gemm(a, w, rounding), gx * wg.to(F32))
    vision = (vision.to(F32) + bias.to(F32)).to(torch.bfloat16)
    flat = mask.reshape(-1)
    dest = torch.full((a.shape[0],), -1, dtype=torch.int64)
    pos = flat.nonzero().flatten()                      # the k-th true entry in row-major order
    dest[:min(len(pos), len(dest))] = pos[:len(dest)]
    out = table[ids.reshape(-1)]
    out[flat] = torch.zeros_like(out[flat])             # the gather leaves masked rows to the GEMM
    keep = dest >= 0
    out[dest[keep]] = vision[keep]
    return out.view(*ids.shape, -1)


def solve_p59(problem, inputs, rounding: str = "rn") -> torch.Tensor:
    """What the p59 kernels return: the fp32 accumulator times fl(x_global * w_global), kept in fp32."""
    x, wp, ws, wg = inputs
    a, _, gx = kernel_quantize(x)
    return gemm(a, decode(problem, wp, ws), rounding).to(F32) * (gx * wg.to(F32))
