#!/usr/bin/env python3
"""The judge's sandbox on a real GPU: what CUDA IPC needs across it, and every attack fixture in both DSLs.

One call on the GPU machine, from the repository root (bwrap installed; gpu_session.sh's `sandbox`
stage installs a staged one):

    PYTHONPATH=. python3 scripts/gpu_sandbox_check.py OUT.json [--only-ipc]

1. CUDA IPC between a referee-like producer in the grading's namespace and a consumer started the
   way the judge starts a harness, in four set-ups: plain processes; the judge's cell (its own
   user, PID, network and IPC namespaces, the grading's /dev/shm); the same cell with a /dev/shm of
   its own; the cell without its own IPC namespace. For each: a memory handle mapped (no event), the
   producer's signal (wire.Signal) seen by the consumer's stream and the consumer's by the
   producer's, and (for the record only) whether a CUDA IPC event handle opens there.
2. Every tests/kernels/attack_*.py graded on the GPU as a CuTe DSL and as a TIRx kernel: a status
   other than passed (torch-only kernels are policy violations on a GPU), none of the canaries or
   the solution's text in the record, no process or working directory left afterwards.
Exits 0 when the judge's own set-up passes every IPC step and every attack is contained.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

PRODUCER = r"""
import base64, json, sys, time, torch
sys.path.insert(0, sys.argv[1])
import wire
t = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
flags = torch.zeros(2, dtype=torch.int32, device="cuda")
ours, theirs = wire.Signal(flags[0:1]), wire.Signal(flags[1:2])
ours.record()
event = torch.cuda.Event(interprocess=True); event.record(); torch.cuda.synchronize()
print(json.dumps({"leaf": wire.ipc_share(t), "signals": wire.encode(flags, wire.ipc_share),
                  "event": base64.b64encode(bytes(event.ipc_handle())).decode()}), flush=True)
result = {"consumer": json.loads(sys.stdin.readline())}
try:
    theirs.wait_next(); done = torch.cuda.Event(); done.record(); deadline = time.monotonic() + 10
    while not done.query():
        if time.monotonic() > deadline:
            theirs.release(); raise TimeoutError("the consumer's signal never came")
    result["consumer_signal_seen_by_producer"] = "ok"
except Exception as exc:
    result["consumer_signal_seen_by_producer"] = f"{type(exc).__name__}: {exc}"[:300]
print(json.dumps(result), flush=True)
"""
CONSUMER = r"""
import base64, json, sys, torch
sys.path.insert(0, sys.argv[1])
import wire
offer, out = json.loads(sys.stdin.readline()), {}
def step(name, fn):
    try:
        out[name] = fn()
    except Exception as exc:
        out[name] = f"{type(exc).__name__}: {exc}"[:300]
step("memory", lambda: float(wire.open_ipc_leaf(offer["leaf"]).sum().item()))
def signals():
    producer, mine = wire.signals(offer["signals"])
    producer.wait_next(); torch.cuda.synchronize(); mine.record(); torch.cuda.synchronize(); return "ok"
step("producer_signal_seen", signals)
def event():  # what the judge no longer uses: recorded for docs/judge.md
    e = torch.cuda.Event.from_ipc_handle(0, base64.b64decode(offer["event"]))
    torch.cuda.current_stream().wait_event(e); torch.cuda.synchronize(); return "ok"
step("cuda_ipc_event_opened", event)
print(json.dumps(out), flush=True)
sys.stdin.readline()
"""
EXPECTED_SUM = float(sum(range(1 << 20)))


def ipc_variants() -> dict:
    """Each set-up's outcome of the four IPC steps (what docs/judge.md records)."""
    from mkb.judge import sandbox
    from mkb.judge.launch import HARNESS_DIR
    from mkb.judge.view import View

    found, why = sandbox.find()
    results = {"sandbox": why}
    view = View.for_harness(harness_dir=str(HARNESS_DIR), stage=None, stage_root="/kernel", gpu=True,
                            visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"), tmp_bytes=256 << 20, private=())
    for name in ("plain", "judge cell", "cell with its own /dev/shm", "cell sharing the host's IPC namespace"):
        if name != "plain" and found is None:
            results[name] = {"skipped": "no sandbox"}
            continue
        results[name] = _exchange(found, view, name)
    return results


def _exchange(found, view, name: str) -> dict:
    from mkb.judge.launch import HARNESS_DIR

    harness = str(HARNESS_DIR)
    producer_cmd = [sys.executable, "-c", PRODUCER, harness]
    consumer_cmd = [sys.executable, "-c", CONSUMER, harness]
    if name != "plain":
        producer_cmd = found.jail_argv(256 << 20) + producer_cmd
    producer = subprocess.Popen(producer_cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        offer = producer.stdout.readline()
        if name != "plain":
            jail = _jail_pid(producer.pid)
            cell = found.cell_argv(jail, view)
            if name == "cell with its own /dev/shm":
                i = cell.index("/dev/shm")  # --bind /dev/shm /dev/shm -> --tmpfs /dev/shm
                cell[i - 1:i + 2] = ["--tmpfs", "/dev/shm"]
            if name == "cell sharing the host's IPC namespace":
                cell.remove("--unshare-ipc")
            consumer_cmd = cell + [sys.executable, "-c", CONSUMER, "/judge"]
        consumer = subprocess.Popen(consumer_cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        consumer.stdin.write(offer)
        consumer.stdin.flush()
        reply = consumer.stdout.readline()
        producer.stdin.write(reply or "{}\n")
        producer.stdin.flush()
        result = json.loads(producer.stdout.readline() or "{}")
        consumer.stdin.write("\n")
        consumer.stdin.flush()
        consumer.wait(60)
    finally:
        producer.kill()
        producer.wait()
    return result


def _jail_pid(bwrap_pid: int) -> int:
    """The producer's own pid inside the jail (bwrap's child)."""
    children = Path(f"/proc/{bwrap_pid}/task/{bwrap_pid}/children").read_text().split()
    return int(children[0])


def attacks() -> list[dict]:
    from test_judge import fixture_facts
    from test_judge_sandbox import ATTACKS, CANARIES, SOLUTION_TEXT, judge_processes

    from mkb.judge import grade
    from mkb.judge.launch import discard_spares
    from mkb.problems import catalog_for, resolve
    from mkb.settings import load_settings

    os.environ.update(CANARIES)
    catalog, rows = catalog_for(ROOT / "problems"), []
    for path in ATTACKS:
        memory_mb = fixture_facts(path)["memory_mb"]
        settings = load_settings(judge_spares=0, **({"judge_memory_mb": memory_mb} if memory_mb else {}))
        for dsl in ("cutedsl", "tirx"):
            started = time.monotonic()
            record = grade(resolve("p28", catalog), path, dsl, device="cuda", scale="smoke", settings=settings,
                           timeout_s=300)
            discard_spares()
            text = record.model_dump_json()
            leaked = [s for s in (*CANARIES.values(), SOLUTION_TEXT) if s in text]
            left = judge_processes(f"mkb-judge-{os.getpid()}.") + judge_processes("mkb-attack-survivor")
            dirs = [str(p) for p in Path(tempfile.gettempdir()).glob(f"mkb-judge-{os.getpid()}.*")]
            ok = record.status != "passed" and not leaked and not left and not dirs
            rows.append({"fixture": path.stem, "dsl": dsl, "ok": ok, "status": record.status, "leaked": leaked,
                         "processes_left": len(left), "dirs_left": dirs, "message": record.message[:500],
                         "seconds": round(time.monotonic() - started, 1), "isolation": record.details.get("isolation")})
            print(f"{'OK ' if ok else 'BAD'} {path.stem:<26} {dsl:<8} {record.status:<17} | {record.message[:120]}",
                  file=sys.stderr, flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--only-ipc", action="store_true", help="run the IPC set-ups only")
    args = parser.parse_args()
    from mkb.environment import describe

    out = {"environment": describe(), "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "ipc": ipc_variants()}
    print(json.dumps(out["ipc"], indent=1), file=sys.stderr, flush=True)
    judge_cell = out["ipc"].get("judge cell", {})
    steps = judge_cell.get("consumer", {})
    ok = (judge_cell.get("consumer_signal_seen_by_producer") == "ok" and steps.get("producer_signal_seen") == "ok"
          and steps.get("memory") == EXPECTED_SUM)
    Path(args.out).write_text(json.dumps(out, indent=1, default=str))
    if not args.only_ipc:
        out["attacks"] = attacks()
        ok &= all(row["ok"] for row in out["attacks"])
        Path(args.out).write_text(json.dumps(out, indent=1, default=str))
    print(f"{'all contained' if ok else 'NOT ALL CONTAINED'}; records in {args.out}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
