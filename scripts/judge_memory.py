"""The judge's GPU memory per problem at full scale, measured on the CPU (mkb/judge/footprint.py).

    .venv/bin/python scripts/judge_memory.py p03 p45 p47 p51            # a table on stdout
    .venv/bin/python scripts/judge_memory.py --all --json OUT.json       # every problem, and the records

For each problem: one input set, the reference's answer and the fp64 anchor's, the peak of one draw as the referee
makes it (inputs, reference, float64 copies and their transients), the judge's claim (referee/memory.need, the pool
sized for an empty H200) and what that leaves a kernel on a 139.8 GiB H200 beside three CUDA contexts (2 GiB). The
GPU's own figures (allocator rounding, library workspaces) are a little higher: a grading's details.memory has them.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mkb.judge import footprint  # noqa: E402
from mkb.problems import catalog_for, resolve  # noqa: E402

GIB = 1 << 30
H200_BYTES, CONTEXTS_BYTES = int(139.8 * GIB), 2 * GIB


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problems", nargs="*")
    parser.add_argument("--all", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    catalog = catalog_for(ROOT / "problems")
    chosen = [p.id for p in catalog] if args.all else args.problems
    rows = []
    print("| problem | input set | answer | anchor answer | draw peak | judge claim | kernel allowance |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for pid in chosen:
        try:
            found = footprint.measure(resolve(pid, catalog))
        except footprint.Untraceable as exc:
            rows.append({"problem": pid, "untraceable": str(exc)})
            print(f"| {pid} | untraceable on the CPU: {exc} |")
            continue
        claim = found.need(H200_BYTES - CONTEXTS_BYTES, H200_BYTES)
        row = {**asdict(found), "claim": claim, "allowance": H200_BYTES - CONTEXTS_BYTES - claim}
        rows.append(row)
        cells = [row[k] / GIB for k in ("input_set", "answer", "anchor_answer", "draw_peak", "claim", "allowance")]
        print(f"| {pid} | " + " | ".join(f"{c:.2f}" for c in cells) + " |", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"unit": "bytes", "device_bytes": H200_BYTES, "contexts_bytes": CONTEXTS_BYTES,
                                         "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
