#!/usr/bin/env python3
"""Move the pending solutions that passed a GPU grading up to the shipped set, and keep their records.

Usage: python artifact/generators/promote_solutions.py JOB_RECORDS.json [--dry-run]

JOB_RECORDS.json is what the `solutions` stage of scripts/gpu_session.sh wrote (validate_solutions.py --out, with
--pending): one GPU's records. A pending variant moves up (`git mv -f` to problems/solutions/<dsl>/) when it passed
with `dsl_check: passed`, and -- for a problem not shipped yet -- its other DSL passed too (a replacement of a shipped
file moves up alone). The moved variants' records, with kernel_file rewritten to the shipped path, and the records
of shipped files graded in the job replace that GPU's older records in problems/solutions/<gpu>.json. Records of
pending variants that stay pending are not kept there (they are in the job's file and log); other GPUs' records of a
replaced file are dropped (they graded a file no longer shipped; git history keeps them). Then run
artifact/generators/solutions_table.py.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parent))
from validate_solutions import SOLUTIONS, gpu_key, gradings  # noqa: E402


def passed(record: dict) -> bool:
    return record.get("status") == "passed" and record.get("dsl_check") == "passed"


def plan(records: list[dict]) -> tuple[list[dict], list[str]]:
    """(records to keep, with kernel_file as it will be; pending variants that stay, with why)."""
    pending = {(r["problem"], r["dsl"]): r for r in records if r["kernel_file"].startswith("problems/solutions/pending/")}
    keep, stay = [], []
    for r in records:
        key = (r["problem"], r["dsl"])
        if key not in pending:
            keep.append(r)
            continue
        other = "tirx" if r["dsl"] == "cutedsl" else "cutedsl"
        replacement = (SOLUTIONS / r["dsl"] / f"{r['problem']}.py").exists()
        partner = pending.get((r["problem"], other))
        partner_ok = replacement or (SOLUTIONS / other / f"{r['problem']}.py").exists() or (partner and passed(partner))
        if passed(r) and partner_ok:
            keep.append({**r, "kernel_file": f"problems/solutions/{r['dsl']}/{r['problem']}.py"})
        else:
            why = r.get("status") if not passed(r) else f"its {other} variant did not pass"
            stay.append(f"{r['problem']} {r['dsl']}: {why}: {(r.get('message') or '')[:160]}")
    return keep, stay


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records", type=Path)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    if not args.records.exists():
        print(f"no records file {args.records}", file=sys.stderr)
        return 2
    records = json.loads(args.records.read_text())
    gpus = {gpu_key(r["device"]) for r in records}
    if len(gpus) != 1:
        print(f"{args.records} holds the records of {sorted(gpus) or 'no'} GPUs: one GPU's records per file", file=sys.stderr)
        return 2
    target = SOLUTIONS / f"{gpus.pop()}.json"
    keep, stay = plan(records)
    graded_pending = {(r["problem"], r["dsl"]) for r in records if r["kernel_file"].startswith("problems/solutions/pending/")}
    moved = [r for r in keep if (r["problem"], r["dsl"]) in graded_pending]
    for r in moved:
        print(f"move up: {r['problem']} {r['dsl']} ({r['kernel_ms']:.4f} ms, x{r['speedup']:.2f})")
    for line in stay:
        print(f"stays pending: {line}")
    for r in keep:
        if not passed(r):
            print(f"WARNING: shipped {r['problem']} {r['dsl']} failed on the {r['device']}: {r['status']}")
    if args.dry_run:
        return 0
    for r in moved:
        subprocess.run(["git", "mv", "-f", f"problems/solutions/pending/{r['dsl']}/{r['problem']}.py", r["kernel_file"]],
                       cwd=ROOT, check=True)
    old = json.loads(target.read_text()) if target.exists() else []
    fresh = {(r["problem"], r["dsl"]) for r in keep}
    merged = sorted([r for r in old if (r["problem"], r["dsl"]) not in fresh] + keep,
                    key=lambda r: (r["problem"], r["dsl"]))
    target.write_text(json.dumps(merged, indent=1) + "\n")
    replaced = {(r["problem"], r["dsl"]) for r in moved}
    for key, rows in gradings().items():   # other GPUs' gradings of a replaced file describe a file no longer shipped
        other = SOLUTIONS / f"{key}.json"
        kept = [r for r in rows if (r["problem"], r["dsl"]) not in replaced]
        if other != target and len(kept) != len(rows):
            other.write_text(json.dumps(kept, indent=1) + "\n")
            print(f"{len(rows) - len(kept)} records of replaced files dropped from {other.relative_to(ROOT)} "
                  "(in git history)")
    print(f"{len(moved)} moved up, {len(stay)} stay pending; {len(keep)} records into {target.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
