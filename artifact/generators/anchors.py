#!/usr/bin/env python3
"""Grade the external anchors (issue #20) through the judge beside our shipped solutions, on one GPU.

An anchor is a published library's kernel for one of our problems, adapted by our small wrapper
artifact/anchors/<pid>_<library>.py; it is a measurement, never shipped code. Each is graded by
``mkb.judge.grade(info, wrapper, dsl, device=..., timing="paper", anchor=Anchor.installed(...))``: the same
processes, sandbox, draws, tolerance and timing as a submission (validate_solutions.py's call), with the anchor's
modules let through the static scan and its site shown to the candidate (mkb/judge/anchor.py); the record's
details.anchor names the package, its version and everything installed beside it. In the same run, our shipped
solutions of the same problems are graded again (--ours), so the comparison is of one machine at one time.

Writes problems/solutions/anchors_<gpu>.json (anchors_h200.json on the H200; or --out): judge records with
role ("anchor" or "ours"), library, package, version, kernel_file, sol_ms, sol_fraction, device, versions,
graded_at. docs/solutions.md's "External anchors" section renders it (solutions_table.py).

The libraries are installed apart by scripts/install_anchors.sh (staged here by scripts/stage_anchors.sh);
the `anchors` stage of scripts/gpu_session.sh does both steps on the GPU machine.
  python artifact/generators/anchors.py                  # every anchor, and ours beside them
  python artifact/generators/anchors.py --problems p36 --ours none --merge
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from validate_solutions import CEILINGS_BY_GPU, SOLUTIONS, gpu_key, rescore  # noqa: E402  (this directory)

ANCHORS = ROOT / "artifact" / "anchors"
SITE_ROOT = Path(os.environ.get("MKB_ANCHOR_ROOT", "/opt/mkb-anchors"))
"""Where scripts/install_anchors.sh installs each library: <root>/<package>-<version>/site-packages."""


@dataclass(frozen=True)
class Library:
    """A published kernel library some anchors wrap."""

    package: str
    version: str
    """The version staged by scripts/stage_anchors.sh (the grading records the installed one)."""
    dsl: str
    """The DSL its kernels are written in: the variant its anchors are graded as."""
    modules: tuple[str, ...]


LIBRARIES = {"quack": Library("quack-kernels", "0.6.5", "cutedsl", ("quack",))}
"""Wrapper file suffix -> library (artifact/anchors/<pid>_<suffix>.py)."""
UNANCHORED = ("quack-kernels' other operations (GEMM with or without an activation epilogue, softmax, cross-entropy, "
              "LayerNorm) are exactly none of our 74 problems: every GEMM problem is fp32 (p29, p32, p37: quack's GEMMs "
              "take bf16/fp16/fp8 operands), FP8/NVFP4 with block scales and quantisation inside (p52-p61) or fused "
              "with routing, attention or norms; LayerNorm appears only fused (p27, p35, p39, p67) and p31 is a "
              "GroupNorm; softmax and cross-entropy appear only inside attention and MoE routing. RMSNorm alone is "
              "p28 (with the residual add) and p36.")
"""Why no other problem has an anchor (issue #20 asks for one wherever a problem is exactly a library's operation)."""


def anchors(problems: list[str] | None) -> list[tuple[str, str, Path]]:
    """(problem, library key, wrapper) of every anchor, or of the problems named."""
    found = []
    for path in sorted(ANCHORS.glob("p[0-9][0-9]_*.py")):
        pid, _, key = path.stem.partition("_")
        if key in LIBRARIES and (not problems or pid in problems):
            found.append((pid, key, path))
    return found


def site(library: Library, root: Path = SITE_ROOT) -> Path:
    return root / f"{library.package}-{library.version}" / "site-packages"


def row_of(record, info, role: str, path: Path, env: dict, gpu: str | None, ceilings: dict | None,
           library: Library | None) -> dict:
    """A judge record as one row of the anchors file (validate_solutions.py's fields, plus who wrote the kernel)."""
    row = record.model_dump(mode="json")
    row["log_tail"] = row.get("log_tail", "")[-2000:]
    anchor = (record.details or {}).get("anchor") or {}
    row.update(role=role, problem=info.id, dsl=str(record.dsl), status=str(record.status),
               library=library.package if library else None, version=anchor.get("version"),
               dsl_share=record.details.get("dsl_share"), problem_dtype=info.dtype, sol_flops=info.sol_flops,
               sol_bytes=info.sol_bytes, device=gpu or record.device, versions=env,
               graded_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
               kernel_file=str(path.relative_to(ROOT)))
    return rescore([row], {info.id: info}, ceilings)[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", default="", help="comma list such as p28,p36 (default: every anchor)")
    ap.add_argument("--ours", default="cutedsl,tirx",
                    help="DSLs of our shipped solutions graded beside the anchors in the same run ('none': no)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--scale", default="full", choices=("full", "smoke"))
    ap.add_argument("--timeout", type=float, default=None, help="judge timeout per grading (s)")
    ap.add_argument("--site-root", default=str(SITE_ROOT), help="where install_anchors.sh put the libraries")
    ap.add_argument("--out", default=None, help="records file (default problems/solutions/anchors_<gpu>.json)")
    ap.add_argument("--merge", action="store_true", help="replace matching rows in --out, keep the others")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()

    from mkb.problems import catalog_for

    infos = {p.id: p for p in catalog_for(ROOT / "problems")}
    todo = anchors([p for p in args.problems.split(",") if p] or None)
    ours = [d for d in args.ours.split(",") if d and d != "none"]
    if args.dry_run:
        for pid, key, path in todo:
            print(pid, LIBRARIES[key].package, path.relative_to(ROOT), site(LIBRARIES[key], Path(args.site_root)))
        return 0

    from mkb.environment import describe
    from mkb.judge import grade
    from mkb.judge.anchor import Anchor
    from mkb.settings import load_settings

    settings = load_settings(dsl_policy="paper")
    env = describe(with_gpu=True)
    gpu = env["gpus"][0]["name"] if env["gpus"] else None
    out = Path(args.out) if args.out else SOLUTIONS / f"anchors_{gpu_key(gpu) if gpu else 'cpu'}.json"
    ceilings = CEILINGS_BY_GPU.get(gpu_key(gpu)) if gpu else None
    rows = json.loads(out.read_text()) if args.merge and out.exists() else []
    kw = dict(device=args.device, timing="paper", timeout_s=args.timeout, scale=args.scale, settings=settings)
    graded = []
    for pid, key, path in todo:
        library, info = LIBRARIES[key], infos[pid]
        anchor = Anchor.installed(library.package, library.modules, site(library, Path(args.site_root)))
        t0 = time.time()
        graded.append(row_of(grade(info, path, library.dsl, anchor=anchor, **kw), info, "anchor", path, env, gpu,
                             ceilings, library))
        print(f"{pid} anchor {library.package} {anchor.version}: {graded[-1]['status']} "
              f"kernel_ms={graded[-1]['kernel_ms']} ({time.time() - t0:.0f} s)", flush=True)
        for dsl in ours:
            mine = SOLUTIONS / dsl / f"{pid}.py"
            if not mine.exists() or any(r["role"] == "ours" and r["problem"] == pid and r["dsl"] == dsl for r in graded):
                continue
            t0 = time.time()
            graded.append(row_of(grade(info, mine, dsl, **kw), info, "ours", mine, env, gpu, ceilings, None))
            print(f"{pid} ours {dsl}: {graded[-1]['status']} kernel_ms={graded[-1]['kernel_ms']} "
                  f"({time.time() - t0:.0f} s)", flush=True)
        keys = {(r["role"], r["problem"], r["dsl"], r["library"]) for r in graded}
        rows = [r for r in rows if (r["role"], r["problem"], r["dsl"], r["library"]) not in keys] + graded
        rows.sort(key=lambda r: (r["problem"], r["role"], r["dsl"]))
        out.write_text(json.dumps(rows, indent=1) + "\n")   # after every problem: a killed call keeps what it did
    print(f"wrote {len(rows)} rows to {out}")
    return 0 if all(r["status"] == "passed" for r in graded) else 1


if __name__ == "__main__":
    raise SystemExit(main())
