"""CPU replay of p61 (NVFP4 SwiGLU MLP) at full width: the reference as torch runs it on CUDA, the fp64 anchor,
and the two solutions' arithmetic, judged by the referee's rule, with the intermediates compared stage by stage.

Usage: python scripts/p61_replay.py TOKENS SEEDS [--out FILE.json]
Each draw is p61's full hidden 4096 / intermediate 12288 with TOKENS tokens (full scale: 16384), drawn as
make_inputs draws them. The kernels' GEMM is modelled as fp32 accumulation in another order than the
reference's matmul (64-wide K chunks, each chunk's exact bf16 products summed by the CPU's fp32 matmul, the
chunks added in fp32), the epilogue times fl(a_global * w_global), one bf16 rounding: the kernels and the
reference agree up to the accumulation order, which no problem text fixes.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
import nvfp4_model as m  # noqa: E402
from numerics import factor  # noqa: E402
from mkb.tensortree import compare, to_anchor  # noqa: E402

F32, F64, BF = torch.float32, torch.float64, torch.bfloat16
P = m.load_problem("p61")


_WEIGHTS = {}


def draw(tokens: int, seed: int):
    """x redrawn per seed; the weights drawn once (seed 10**6) and reused: the mechanism lives in the
    activations' quantization, and a weight draw costs a minute here."""
    torch.manual_seed(seed)
    x = torch.randn(1, tokens, 4096, dtype=BF)
    if "w" not in _WEIGHTS:
        _WEIGHTS["w"] = _draw_weights()
    return [x, *_WEIGHTS["w"]]


def _draw_weights():
    torch.manual_seed(10 ** 6)
    weights = []
    for rows, cols in ((12288, 4096), (12288, 4096), (4096, 12288)):
        with m.cuda_division():
            packed, scale, g = P._nvfp4_quantize(0.02 * torch.randn(rows, cols))
        weights += [packed, scale, g.item()]
    return weights


_DEQ = {}


def _weight(packed, scale, global_decode, compute):
    """The reference's dequantized weight (its own _nvfp4_dequantize), cached per weight and dtype."""
    key = (packed.data_ptr(), compute)
    if key not in _DEQ:
        w_global = torch.tensor(global_decode, dtype=F32)
        _DEQ[key] = P._nvfp4_dequantize(packed, scale, w_global, compute)
    return _DEQ[key]


def _linear(t, packed, scale, global_decode, compute):
    """The problem's _linear, the weight's dequantization cached."""
    a_packed, a_scale, a_global = P._nvfp4_quantize(t.to(compute))
    a = P._nvfp4_dequantize(a_packed, a_scale, a_global, compute)
    return (a @ _weight(packed, scale, global_decode, compute).T).to(t.dtype)


def _decoded(packed, scale):
    key = (packed.data_ptr(), "bf16")
    if key not in _DEQ:
        _DEQ[key] = m.decode(P, packed, scale)
    return _DEQ[key]


def ref_stages(inputs, anchor: bool):
    """reference()'s own steps (GPU torch division rule), keeping the intermediates."""
    if anchor:
        inputs = to_anchor(inputs)
    x, gp, gs, gg, upk, us, ug, dp, ds, dg = inputs
    compute = torch.promote_types(x.dtype, F32)
    x2 = x.reshape(-1, x.shape[-1])
    with m.cuda_division():
        gate = _linear(x2, gp, gs, gg, compute)
        up = _linear(x2, upk, us, ug, compute)
        h = F.silu(gate) * up
        out = _linear(h, dp, ds, dg, compute)
    return {"gate": gate, "up": up, "h": h, "out": out}


def kernel_gemm(a: torch.Tensor, b: torch.Tensor, chunk: int = 64) -> torch.Tensor:
    """fp32 accumulation of exact bf16 products in 64-wide K chunks (another order than one fp32 matmul)."""
    a32, b32 = a.to(F32), b.to(F32)
    acc = torch.zeros(a.shape[0], b.shape[0], dtype=F32)
    for k0 in range(0, a.shape[1], chunk):
        acc += (a32[:, k0:k0 + chunk].double() @ b32[:, k0:k0 + chunk].double().T).float()
    return acc


def kernel_stages(inputs, exp64: bool, gemm=kernel_gemm, h_bump=None):
    """The solutions' order (tests/nvfp4_model.solve_p61). exp64: TIRx's silu (exp in fp64 rounded to fp32);
    else CuTe DSL's expf (torch's CPU expf here). h_bump: add one bf16 ulp to h at this flat index (a test of
    the global-scale path)."""
    x, gp, gs, gg, upk, us, ug, dp, ds, dg = inputs
    x2 = x.reshape(-1, x.shape[-1])
    a, _, gx = m.kernel_quantize(x2)
    inter = gp.shape[0]
    wg, wu = _decoded(gp, gs), _decoded(upk, us)
    gate = m.epilogue(gemm(a, wg), gx * torch.tensor(gg, dtype=F32))
    up = m.epilogue(gemm(a, wu), gx * torch.tensor(ug, dtype=F32))
    g, u = gate.to(F32), up.to(F32)
    e = torch.exp(-g.double()).float() if exp64 else torch.exp(-g)
    silu = (g / (1.0 + e)).to(BF).to(F32)
    h = (silu * u).to(BF)
    if h_bump is not None:
        flat = h.view(-1)
        flat[h_bump] = (flat[h_bump].view(torch.int16) + 1).view(BF)   # magnitude up one ulp
    ah, _, gh = m.kernel_quantize(h)
    out = m.epilogue(gemm(ah, _decoded(dp, ds)), gh * torch.tensor(dg, dtype=F32))
    return {"gate": gate, "up": up, "h": h, "out": out, "ah": ah, "gh": gh, "a": a}


def judge(out, ref, anchor):
    """(max error, allowance) of the referee's rule (mkb.tensortree.compare) with p61's tolerance factor."""
    found = compare("out", out, ref, anchor, factor(P))
    return found.max_error, found.allowance


def one(tokens: int, seed: int) -> dict:
    t0 = time.time()
    inputs = draw(tokens, seed)
    ref = ref_stages(inputs, anchor=False)
    anc = ref_stages(inputs, anchor=True)
    rec = {"seed": seed, "tokens": tokens}
    ref_err, allowance = judge(ref["out"], ref["out"], anc["out"])
    rec["ref_err"] = ref_err
    rec["allowance"] = allowance
    rec["h_amax"] = {"ref": float(ref["h"].abs().max()), "anchor": float(anc["h"].abs().max())}
    for name, exp64 in (("cutedsl", False), ("tirx", True)):
        k = kernel_stages(inputs, exp64)
        err, _ = judge(k["out"], ref["out"], anc["out"])
        r = {"err": err, "ratio": err / allowance,
             "gate_flips": int((k["gate"] != ref["gate"]).sum()), "up_flips": int((k["up"] != ref["up"]).sum()),
             "h_diff": int((k["h"] != ref["h"]).sum()), "h_amax": float(k["h"].abs().max()),
             "out_vs_ref_max": float((k["out"].double() - ref["out"].double()).abs().max())}
        rec[name] = r
    rec["s"] = round(time.time() - t0, 1)
    return rec


def main():
    tokens, seeds = int(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")] if "," in sys.argv[2] \
        else range(int(sys.argv[2]))
    out = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else None
    torch.set_num_threads(2)
    recs = []
    for seed in seeds:
        rec = one(tokens, seed)
        recs.append(rec)
        print(json.dumps(rec), flush=True)
        if out:
            Path(out).write_text(json.dumps(recs, indent=1))


if __name__ == "__main__":
    main()
