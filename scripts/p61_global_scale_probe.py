"""p61: raise the kernel path's h at its argmax one bf16 ulp (h's global scale moves 2^-8) and judge it (h7p61 probe).

Usage: python scripts/p61_global_scale_probe.py   (two draws of 256 tokens, a JSON line each)
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import p61_replay as r  # noqa: E402

torch.set_num_threads(2)
for seed in (0, 1):
    inputs = r.draw(256, seed)
    ref, anc = r.ref_stages(inputs, False), r.ref_stages(inputs, True)
    ref_err, allow = r.judge(ref["out"], ref["out"], anc["out"])
    idx = int(ref["h"].abs().view(-1).float().argmax())
    rec = {"seed": seed, "ref_err": ref_err, "allowance": allow}
    for bump in (None, idx):
        k = r.kernel_stages(inputs, False, h_bump=bump)
        err, _ = r.judge(k["out"], ref["out"], anc["out"])
        d = (k["out"].double() - ref["out"].double()).abs()
        rec["bump" if bump is not None else "plain"] = {
            "err": err, "ratio": err / allow, "h_amax": float(k["h"].abs().max()),
            "ah_diff": int((k["ah"] != r.m.kernel_quantize(ref["h"])[0]).sum()) if bump is not None else None,
            "out_vs_ref_max": float(d.max()), "rows_over_ref_err": int((d.amax(1) > ref_err).sum())}
    print(json.dumps(rec), flush=True)
