#!/usr/bin/env python3
"""Grade every shipped reference solution through the real judge and record the results.

For each problems/solutions/<dsl>/pNN.py this calls ``mkb.judge.grade(problem_info, kernel_path, dsl,
device=..., timing=...)`` -- the same entry point as ``mkb verify`` and the agent's submit tool -- and
writes a JSON list of judge records to problems/solutions/<gpu>.json (``h200.json`` on the H200, ``h100.json``
on an H100: the GPU it ran on names the file; or --out).  Each record is the
JudgeRecord (status, message, draws, kernel_ms, eager_ms, speedup, dsl_check, details) plus:

  problem, dsl, status, speedup, kernel_ms, eager_ms   (as the judge returned them)
  sol_ms        the speed-of-light time of the problem's SOL flops/bytes on the ceilings below
  sol_fraction  sol_ms / kernel_ms (1.0 = at the roofline bound)
  ceilings      the ceilings of the GPU it ran on (CEILINGS below; H200: HBM ~4.3 TB/s measured copy
                bandwidth; dense tensor-core ~790 TFLOP/s bf16/fp16, ~1580 TFLOP/s fp8; ~60 TFLOP/s fp32
                CUDA cores); a GPU with no measured ceilings records sol_ms and sol_fraction as null until
                artifact/generators/measure_ceilings.py has measured it and ``--rescore`` recomputes them
  device, versions, graded_at

A device call is limited to 10 minutes, so grade in slices and merge:
  python artifact/generators/validate_solutions.py --problems p28,p25,p19 --merge
  python artifact/generators/validate_solutions.py --problems p01,p14 --merge   ...
``--dry-run`` lists what would be graded.  Needs a GPU for meaningful records (``--device cpu``
grades structure/correctness at the chosen scale without timings).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SOLUTIONS = ROOT / "problems" / "solutions"
CEILINGS_BY_GPU = {
    "h200": {
        "hbm_bytes_per_s": 4.3e12,
        "flops_per_s": {"bf16": 790e12, "fp16": 790e12, "fp8": 1580e12, "fp32": 60e12, "uint8": 790e12,
                        "int8": 1580e12},
        "note": "H200 SXM: HBM copy bandwidth and dense bf16 tensor-core rate as measured on the lent H200 "
                "(~4.3 TB/s, ~790 TFLOP/s); fp8 = 2x bf16; fp32 = CUDA-core FMA rate. SOL time = "
                "max(flops / rate(problem DTYPE), bytes / bandwidth).",
    },
    "h100": {
        "hbm_bytes_per_s": 3.0e12,
        "flops_per_s": {"bf16": 760e12, "fp16": 760e12, "fp8": 1500e12, "fp32": 52e12, "uint8": 760e12,
                        "int8": 1500e12},
        "note": "H100 80GB HBM3 (SXM): a 2 GiB device copy (3.0 TB/s), 8192^3 bf16 GEMM (760 TFLOP/s) and fp32 GEMM "
                "(52 TFLOP/s) measured on the lent H100 on 2026-12-07 (artifact/generators/measure_ceilings.py, "
                "artifact/judge/ceilings_h100_2026-12-07.json; fp8 measured 1436 TFLOP/s, the rule 2x bf16 kept). "
                "SOL time = max(flops / rate(problem DTYPE), bytes / bandwidth).",
    },
}
"""Speed-of-light ceilings per GPU (the records file's name), each measured on that GPU; a GPU missing here has
no SOL figures until measured (artifact/generators/measure_ceilings.py writes the numbers to put here)."""
CEILINGS = CEILINGS_BY_GPU["h200"]


def gpu_key(name: str) -> str:
    """The records file's key for a GPU name: 'NVIDIA H200' -> 'h200', 'NVIDIA H100 80GB HBM3' -> 'h100'."""
    for word in name.lower().replace("-", " ").split():
        if word != "nvidia" and word[0].isalpha() and any(c.isdigit() for c in word):
            return word
    raise ValueError(f"cannot name a records file after the GPU {name!r}: pass --out")


def sol_ms(info, ceilings=CEILINGS) -> float | None:
    if ceilings is None:
        return None
    rate = ceilings["flops_per_s"].get(info.dtype, ceilings["flops_per_s"]["bf16"])
    return max(info.sol_flops / rate, info.sol_bytes / ceilings["hbm_bytes_per_s"]) * 1e3


def gradings() -> dict[str, list[dict]]:
    """Every GPU's records of the shipped solutions: {'h200': [...], 'h100': [...]} from problems/solutions/<gpu>.json."""
    return {path.stem: json.loads(path.read_text()) for path in sorted(SOLUTIONS.glob("*.json"))
            if "_" not in path.stem}   # not h200_strict.json (another policy) nor h200_standalone_check.json


def source_changed(record: dict) -> bool | None:
    """Whether the solution file changed since this record graded it (its kernel_sha256 against today's file);
    None when the record has no digest or the file is gone."""
    path = ROOT / record["kernel_file"]
    if not record.get("kernel_sha256") or not path.exists():
        return None
    return hashlib.sha256(path.read_bytes()).hexdigest() != record["kernel_sha256"]


def rescore(records: list[dict], infos: dict, ceilings: dict | None) -> list[dict]:
    """The SOL fields of records recomputed from ceilings (after a GPU's ceilings were measured)."""
    for row in records:
        info = infos.get(row["problem"])
        if info is None:
            continue
        sol = sol_ms(info, ceilings)
        row.update(sol_ms=sol, ceilings=ceilings,
                   sol_fraction=(sol / row["kernel_ms"]) if sol is not None and row.get("kernel_ms") else None)
    return records


def markdown_table(records: list[dict]) -> str:
    """problem x DSL table of a records file (status, kernel/eager ms, speedup, SOL fraction)."""
    rows = ["| problem | dsl | status | kernel ms | eager ms | speedup | SOL fraction | dsl check |",
            "|---|---|---|---|---|---|---|---|"]
    fmt = lambda v, f: "" if v is None else format(v, f)  # noqa: E731
    for r in sorted(records, key=lambda r: (r.get("problem", ""), r.get("dsl", ""))):
        rows.append(f"| {r.get('problem')} | {r.get('dsl')} | {r.get('status')} | {fmt(r.get('kernel_ms'), '.4f')} | "
                    f"{fmt(r.get('eager_ms'), '.3f')} | {fmt(r.get('speedup'), '.2f')} | "
                    f"{fmt(r.get('sol_fraction'), '.2f')} | {r.get('dsl_check', '')} |")
    return "\n".join(rows)


PENDING = SOLUTIONS / "pending"
"""Solutions written and built for sm_90a but not yet graded on a GPU (pending/README.md): not shipped, so the
oracle does not use them; --pending grades them, and one that passes is moved up to problems/solutions/<dsl>/."""


def shipped(problems: list[str] | None, dsls: list[str], pending: bool = False) -> list[tuple[str, str, Path]]:
    """(problem, dsl, file) to grade: the shipped solutions, and with pending the pending ones too, where a
    pending file named like a shipped one (a replacement waiting for its grading) is graded instead of it."""
    todo = []
    for dsl in dsls:
        waiting = {p.stem: p for p in (PENDING / dsl).glob("p[0-9][0-9].py")} if pending else {}
        found = {p.stem: p for p in (SOLUTIONS / dsl).glob("p[0-9][0-9].py")} | waiting
        for _, path in sorted(found.items()):
            if problems and path.stem not in problems:
                continue
            todo.append((path.stem, dsl, path))
    # problem by problem, both DSLs together, in the order asked for (a device call may end before the list does)
    rank = {pid: i for i, pid in enumerate(problems or [])}
    return sorted(todo, key=lambda t: (rank.get(t[0], len(rank)), t[0], t[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", default="",
                    help="comma list such as p28,p25, graded in that order (default: every shipped solution)")
    ap.add_argument("--dsl", default="cutedsl,tirx")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cuda (default) or cpu")
    ap.add_argument("--timing", default="paper", choices=("paper", "flushed"))
    ap.add_argument("--scale", default="full", choices=("full", "smoke"))
    ap.add_argument("--timeout", type=float, default=None, help="judge timeout per variant (s)")
    ap.add_argument("--dsl-policy", default="paper", choices=("paper", "strict"),
                    help="DSL-use policy to grade under (strict also requires the DSL share, issue #24)")
    ap.add_argument("--out", default=None, help="records file (default problems/solutions/<gpu>.json, e.g. h200.json)")
    ap.add_argument("--merge", action="store_true", help="replace matching records in --out, keep the others")
    ap.add_argument("--pending", action="store_true",
                    help="also grade problems/solutions/pending/ (written, not yet graded on a GPU)")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--table", action="store_true", help="print a markdown table of --out and exit")
    ap.add_argument("--rescore", metavar="GPU",
                    help="recompute the SOL fields of --out from CEILINGS_BY_GPU[GPU] (e.g. h100) and exit")
    args = ap.parse_args()
    if args.table or args.rescore:
        if args.out is None:
            print("name the records file: --out problems/solutions/h200.json", file=sys.stderr)
            return 2
        if args.table:
            print(markdown_table(json.loads(Path(args.out).read_text())))
            return 0

    from mkb.problems import problem_files, parse_problem

    todo = shipped([p for p in args.problems.split(",") if p] or None, args.dsl.split(","), args.pending)
    infos = {}
    for f in problem_files(ROOT / "problems"):
        try:
            info = parse_problem(f)
        except Exception as exc:  # noqa: BLE001  (a file still being written elsewhere)
            print(f"skip {f.name}: {exc}", file=sys.stderr)
            continue
        infos[info.id] = info
    if args.rescore:
        if args.rescore not in CEILINGS_BY_GPU:
            print(f"no ceilings for {args.rescore}: measure them (measure_ceilings.py) and add them to CEILINGS_BY_GPU",
                  file=sys.stderr)
            return 2
        out_path = Path(args.out)
        out_path.write_text(json.dumps(rescore(json.loads(out_path.read_text()), infos,
                                               CEILINGS_BY_GPU[args.rescore]), indent=1) + "\n")
        return 0
    if args.dry_run:
        for pid, dsl, path in todo:
            print(pid, dsl, path.relative_to(ROOT), "OK" if pid in infos else "NO PROBLEM FILE")
        return 0

    from mkb.environment import describe
    from mkb.judge import grade
    from mkb.settings import load_settings

    settings = load_settings(dsl_policy=args.dsl_policy)
    env = describe(with_gpu=True)  # where the gradings ran: host, versions, GPUs, CUDA, driver
    gpu = env["gpus"][0]["name"] if env["gpus"] else None
    out_path = Path(args.out) if args.out else SOLUTIONS / f"{gpu_key(gpu) if gpu else 'cpu'}.json"
    ceilings = CEILINGS_BY_GPU.get(gpu_key(gpu)) if gpu else None
    records = json.loads(out_path.read_text()) if (args.merge and out_path.exists()) else []
    failures = 0
    for pid, dsl, path in todo:
        info = infos.get(pid)
        if info is None:
            print(f"{pid} {dsl}: no valid problem file, skipped", flush=True)
            failures += 1
            continue
        t0 = time.time()
        rec = grade(info, path, dsl, device=args.device, timing=args.timing, timeout_s=args.timeout,
                    scale=args.scale, settings=settings)
        row = rec.model_dump(mode="json")
        log = row.get("log_tail", "")   # the error's first lines and its last ones (a C++ abort's frames fill the end)
        row["log_tail"] = log if len(log) <= 4000 else log[:2000] + "\n[...]\n" + log[-2000:]
        row.update(problem=pid, dsl=dsl, status=str(rec.status), speedup=rec.speedup, kernel_ms=rec.kernel_ms,
                   dsl_policy=args.dsl_policy, dsl_share=rec.details.get("dsl_share"),
                   eager_ms=rec.eager_ms, problem_dtype=info.dtype, sol_flops=info.sol_flops,
                   sol_bytes=info.sol_bytes, device=gpu or rec.device,
                   versions=env, graded_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                   kernel_file=str(path.relative_to(ROOT)),
                   kernel_sha256=hashlib.sha256(path.read_bytes()).hexdigest())
        rescore([row], infos, ceilings)
        records = [r for r in records if not (r.get("problem") == pid and r.get("dsl") == dsl)] + [row]
        records.sort(key=lambda r: (r.get("problem", ""), r.get("dsl", "")))
        out_path.write_text(json.dumps(records, indent=1) + "\n")        # after every variant: nothing is lost
        where = " pending" if path.parent.parent == PENDING else ""   # a replacement, graded instead of the shipped file
        line = f"{pid:4s} {dsl:8s}{where} {row['status']:16s} {time.time() - t0:6.1f}s"
        if rec.speedup is not None:
            line += (f"  kernel {rec.kernel_ms:.4f} ms  eager {rec.eager_ms:.3f} ms  x{rec.speedup:.2f}"
                     f"  SOL {row['sol_fraction'] or 0:.2f}  dsl_check {rec.dsl_check}")
        if rec.details.get("dsl_share") is not None:
            line += f"  DSL share {rec.details['dsl_share']:.1%}"
        if rec.message:
            line += "  | " + rec.message.replace("\n", " ")[:240]
        print(line, flush=True)
        failures += row["status"] != "passed"
    print(f"{len(todo) - failures}/{len(todo)} passed -> {out_path}", flush=True)
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
