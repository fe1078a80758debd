"""Compare a `reference` run on the Ray executor with the local executor's run of the same trials.

    python artifact/generators/ray_compare.py LOCAL.duckdb RAY.duckdb [--model reference] > ray_vs_local.json

For every finished trial of RAY.duckdb it prints the status and speedup in both databases and whether
they agree. Statuses must be identical. Speedups agree when their relative difference is at most the
judge's noise floor for that kernel, measured in the same databases: the largest relative spread
between any two gradings of the same kernel source (feedback and final submissions, in either run),
and never less than MIN_NOISE. Throughput is trials per hour of each run's wall time.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

import duckdb

MIN_NOISE = 0.02
"""The judge's repeatability target for kernels >= 50 us (issue #3): the least difference called noise."""


def _read(db: str, model: str) -> tuple[dict[str, dict], dict[str, list[float]], float | None]:
    """Finished trials (with their final kernel's hash), passed gradings' speedups by kernel, run wall time."""
    with duckdb.connect(db, read_only=True) as con:
        keys = ("trial_id", "status", "speedup", "wall_s", "kernel_sha256")
        rows = con.execute(
            "SELECT trial_id, status, speedup, wall_s, (SELECT kernel_sha256 FROM submissions s WHERE s.attempt_id = "
            "t.attempt_id ORDER BY n DESC LIMIT 1) FROM trials t WHERE model = ? AND state = 'finished'",
            [model]).fetchall()
        gradings = con.execute("SELECT s.kernel_sha256, s.speedup FROM submissions s JOIN trials t USING (attempt_id) "
                               "WHERE t.model = ? AND s.status = 'passed' AND s.speedup IS NOT NULL", [model]).fetchall()
        wall = con.execute("SELECT sum(epoch(finished_at) - epoch(started_at)) FROM runs WHERE model = ? AND "
                           "finished_at IS NOT NULL", [model]).fetchone()[0]
    by_kernel = defaultdict(list)
    for sha, speedup in gradings:
        by_kernel[sha].append(speedup)
    return {r[0]: dict(zip(keys, r)) for r in rows}, by_kernel, wall


def compare(local_db: str, ray_db: str, model: str = "reference") -> dict:
    (local, local_gradings, _), (ray, ray_gradings, ray_wall) = _read(local_db, model), _read(ray_db, model)
    spread: dict[str, list[float]] = defaultdict(list)
    for by_kernel in (local_gradings, ray_gradings):
        for sha, values in by_kernel.items():
            spread[sha] += values
    rows = []
    for trial_id, r in sorted(ray.items()):
        lo = local.get(trial_id)
        values = spread.get(r["kernel_sha256"], [])
        noise = max(MIN_NOISE, (max(values) - min(values)) / min(values) if len(values) > 1 else 0.0)
        row = {"trial": trial_id, "status_ray": r["status"], "status_local": lo and lo["status"],
               "speedup_ray": r["speedup"], "speedup_local": lo and lo["speedup"], "noise_floor": round(noise, 4),
               "gradings_of_kernel": len(values), "wall_s_ray": r["wall_s"], "wall_s_local": lo and lo["wall_s"]}
        if lo is None:
            row["agree"], row["why"] = None, "no finished local trial to compare with"
        elif r["status"] != lo["status"]:
            row["agree"], row["why"] = False, "statuses differ"
        elif r["speedup"] is None or lo["speedup"] is None:
            row["agree"], row["why"] = r["speedup"] == lo["speedup"], "no speedup (not passed)"
        else:
            diff = abs(r["speedup"] - lo["speedup"]) / lo["speedup"]
            row["rel_diff"] = round(diff, 4)
            row["agree"], row["why"] = diff <= noise, f"speedups differ by {diff:.1%} (noise floor {noise:.1%})"
        rows.append(row)
    compared = [r for r in rows if r["agree"] is not None]
    return {"model": model, "trials": rows, "compared": len(compared), "agree": sum(bool(r["agree"]) for r in compared),
            "ray_run_wall_s": ray_wall,
            "ray_trials_per_hour": round(3600 * len(ray) / ray_wall, 1) if ray_wall else None,
            "rule": f"identical status; |speedup_ray - speedup_local| / speedup_local <= max({MIN_NOISE}, largest "
                    f"relative spread between gradings of the same kernel in either run)"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("local_db")
    ap.add_argument("ray_db")
    ap.add_argument("--model", default="reference")
    args = ap.parse_args(argv)
    result = compare(args.local_db, args.ray_db, args.model)
    print(json.dumps(result, indent=1, default=str))
    return 0 if result["compared"] and result["agree"] == result["compared"] else 1


if __name__ == "__main__":
    sys.exit(main())
