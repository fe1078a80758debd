"""Measure the Ray executor's overheads on this machine (docs/ray.md quotes the numbers).

    .venv/bin/python scripts/ray_throughput.py [--problems p28,p32] [--cpus 2] [--real-judge]

Prints one JSON object: per-store-call round trip from a task to the driver's DuckDB file, the wall
time of `reference` runs with an instant stand-in judge on the local executor and on a local Ray
instance (the executors' own cost per trial), and with --real-judge the per-evaluation time of the
real judge in a CPU judge actor (smoke scale).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import ray

from mkb import protocol
from mkb.protocol.ray_channel import Drainer, Inbox, Outbox
from mkb.protocol.ray_executor import RayOptions, run_model_ray
from mkb.protocol.ray_judges import JudgeWorker
from mkb.records import JudgeRecord, Status
from mkb.settings import load_settings
from mkb.store import Store

KERNEL = Path(__file__).resolve().parent.parent / "tests" / "kernels" / "valid_tirx_p28.py"


def instant_grade(problem, kernel_path, dsl, device_slot="cpu"):
    return JudgeRecord(status=Status.PASSED, problem=problem.id, dsl=dsl, device="cpu")


def smoke_grade(problem, kernel_path, dsl, device_slot="cpu"):
    from mkb.judge import grade

    return grade(problem, kernel_path, dsl, device="cpu", scale="smoke")


def put_many(inbox, n: int) -> list[float]:
    outbox, took = Outbox(inbox, threading.Event()), []
    for seq in range(n):
        started = time.perf_counter()
        outbox.add_message("bench", seq, {"role": "user", "content": "x" * 2000})
        took.append(time.perf_counter() - started)
    return took


def store_call_ms(db: Path, n: int = 200) -> dict:
    with Store(db) as store:
        inbox = ray.remote(Inbox).options(num_cpus=0).remote()
        drainer = Drainer(ray, inbox, store, threading.Event())
        drainer.start()
        took = ray.get(ray.remote(put_many).remote(inbox, n))
        drainer.stop()
    ms = sorted(t * 1000 for t in took[10:])
    return {"n": len(ms), "median_ms": round(statistics.median(ms), 2), "p95_ms": round(ms[int(len(ms) * .95)], 2)}


def reference_run(db: Path, request, executor: str) -> dict:
    settings = load_settings(home=db.parent / f"home-{executor}")
    with Store(db) as store:
        items = protocol.make_plan(settings, store, request)
        started = time.monotonic()
        if executor == "ray":
            run_model_ray(settings, store, request, items, RayOptions(), device="cpu", grade=instant_grade)
        else:
            protocol.run_model(settings, store, request, items, instant_grade, protocol.executor_factory("local", "", settings))
        wall_s = time.monotonic() - started
        trials = store.trials(request.model)
    return {"trials": len(trials), "wall_s": round(wall_s, 1),
            "trials_per_hour": round(3600 * len(trials) / wall_s),
            "median_attempt_s": round(statistics.median(t["wall_s"] for t in trials), 2)}


def judge_eval_s(n: int = 3) -> dict:
    from mkb.problems import catalog_for, resolve

    p28 = resolve("p28", catalog_for(load_settings().problems_dir))
    worker = ray.remote(JudgeWorker).options(num_cpus=1).remote(smoke_grade, "cpu")
    took, statuses = [], []
    for _ in range(n):
        started = time.monotonic()
        statuses.append(str(ray.get(worker.grade.remote(p28, KERNEL.read_text(), "tirx")).status))
        took.append(time.monotonic() - started)
    return {"n": n, "statuses": statuses, "median_s": round(statistics.median(took), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", default="p28,p32,p01,p14")
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--real-judge", action="store_true")
    args = parser.parse_args()
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    request = protocol.RunRequest(model="reference", problems=args.problems.split(","), concurrency=args.cpus)
    with tempfile.TemporaryDirectory() as tmp:
        out = {"cpus": args.cpus, "store_call": store_call_ms(Path(tmp) / "calls.duckdb"),
               "reference_local": reference_run(Path(tmp) / "local.duckdb", request, "local"),
               "reference_ray": reference_run(Path(tmp) / "ray.duckdb", request, "ray")}
        if args.real_judge:
            out["judge_cpu_smoke_p28"] = judge_eval_s()
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
