"""Why does a short kernel's in-process time land at one of two levels per process? A GPU probe.

The judge's paper figure (CUDA events around solve() in the candidate's process) came out at
0.06-0.07 ms in some processes and 0.10-0.12 ms in others for p19 and p25 (kernels of 48-67 us on the
GPU, so the host's launch path is part of the figure). This probe times the same kernel the same way
in plain processes, outside the judge, under controlled CPU placement:

  unpinned    fresh processes, nothing else running
  cpu<N>      the process pinned to logical CPU N (one per physical core, then the SMT siblings)
  sib-spin    pinned, with a busy-polling process (like the referee's pipe poll) on its SMT sibling
  core-spin   pinned, with the busy-polling process on another physical core
  load<K>     unpinned, with K unpinned busy processes (like spares importing torch)

Workers start together and wait on stdin; the probe releases them one at a time, so measurements never
overlap. Usage (on the GPU machine, from the repository root):

    python scripts/gpu_spread_probe.py OUT.json p25:cutedsl:problems/solutions/cutedsl/p25.py ...
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mkb.judge.referee.cpus import parse_cpulist, read_sysfs  # noqa: E402

WARMUP, TIMED, SETS = 10, 50, 4
SPIN = "import os\nr, w = os.pipe()\nos.set_blocking(r, False)\nwhile True:\n    try:\n        os.read(r, 1)\n    except BlockingIOError:\n        pass\n"


def worker(problem_id: str, kernel: str, cpu: int | None) -> None:
    """Prepare, say ready, wait for go, time WARMUP + TIMED calls like the paper, print one JSON line."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    import importlib.util

    import torch

    from mkb.problems import catalog_for, load_module, resolve
    from mkb.settings import Settings

    problem = load_module(resolve(problem_id, catalog_for(Settings().problems_dir)))
    spec = importlib.util.spec_from_file_location("probe_kernel", kernel)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sets = []
    for s in range(SETS):
        torch.manual_seed(1000 + s)
        sets.append(problem.make_inputs(device="cuda", scale="full"))
    for fn in (module.solve, problem.reference):
        fn(*sets[0])
    torch.cuda.synchronize()
    print(json.dumps({"ready": True}), flush=True)
    sys.stdin.readline()
    result = {"cpu_at_start": _cpu_now(), "affinity": sorted(os.sched_getaffinity(0))}
    for name, fn in (("kernel", module.solve), ("eager", problem.reference)):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        events, host = [], []
        for k in range(WARMUP + TIMED):
            inputs = sets[k % SETS]
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            start.record()
            fn(*inputs)
            end.record()
            t1 = time.perf_counter()
            end.synchronize()
            if k >= WARMUP:
                events.append(start.elapsed_time(end))
                host.append((t1 - t0) * 1e3)
        result[name] = {"ms": statistics.median(events), "min_ms": min(events), "max_ms": max(events),
                        "host_ms": statistics.median(host)}
    result["cpu_at_end"] = _cpu_now()
    print(json.dumps(result), flush=True)


def _cpu_now() -> int:
    return int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[36])


def topology() -> dict:
    """CPUs, SMT siblings, NUMA nodes, the GPU's local CPUs, frequency governor."""
    cpus = sorted(os.sched_getaffinity(0))
    siblings, packages = {}, {}
    for c in cpus:
        base = Path(f"/sys/devices/system/cpu/cpu{c}/topology")
        siblings[c] = read_sysfs(base / "thread_siblings_list")
        packages[c] = read_sysfs(base / "physical_package_id")
    facts = {"cpus": cpus, "siblings": siblings, "packages": packages, "machine": platform.platform(),
             "governor": read_sysfs(Path("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")),
             "numa_nodes": {p.name: read_sysfs(p / "cpulist") for p in sorted(Path("/sys/devices/system/node").glob("node*"))}}
    for cmd in (["nvidia-smi", "topo", "-m"], ["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader"],
                ["lscpu"]):
        try:
            facts[" ".join(cmd)] = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired) as exc:
            facts[" ".join(cmd)] = str(exc)
    bus = facts.get("nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader", "").strip().splitlines()
    if bus:
        dev = bus[0].lower().replace("00000000:", "0000:")
        facts["gpu_local_cpulist"] = read_sysfs(Path(f"/sys/bus/pci/devices/{dev}/local_cpulist"))
        facts["gpu_numa_node"] = read_sysfs(Path(f"/sys/bus/pci/devices/{dev}/numa_node"))
    return facts


def _spinner(cpu: int | None) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", SPIN])
    if cpu is not None:
        os.sched_setaffinity(proc.pid, {cpu})
    return proc


def cpu_pairs(target: int, cpus: list[int]) -> dict:
    """Slowdown of a Python loop on `target` while a busy-poller runs on each other CPU (finds hidden siblings)."""
    os.sched_setaffinity(0, {target})

    def loop_ms() -> float:
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            x = 0
            for i in range(200_000):
                x += i
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)

    alone = loop_ms()
    ratios = {}
    for other in cpus:
        if other == target:
            continue
        spinner = _spinner(other)
        time.sleep(0.1)
        ratios[other] = round(loop_ms() / alone, 3)
        spinner.kill()
        spinner.wait()
    os.sched_setaffinity(0, set(cpus))
    return {"target": target, "alone_ms": alone, "ratio_by_other_cpu": ratios}


def _json_line(proc: subprocess.Popen, key: str) -> dict | None:
    """The worker's next JSON line holding `key` (other output, e.g. a library's notices, is skipped)."""
    for line in proc.stdout:
        if line.startswith("{"):
            value = json.loads(line)
            if key in value:
                return value
    return None


def run_batch(case: str, configs: list[tuple[str, int | None, list[int | None]]]) -> list[dict]:
    """configs: (label, worker cpu, spinner cpus). Workers start together; measured one at a time."""
    problem_id, _dsl, kernel = case.split(":")
    workers = []
    for label, cpu, spins in configs:
        argv = [sys.executable, __file__, "--worker", problem_id, kernel, "" if cpu is None else str(cpu)]
        workers.append((label, cpu, spins, subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                             text=True)))
    for _label, _cpu, _spins, proc in workers:
        if _json_line(proc, "ready") is None:
            raise SystemExit("a worker failed to start (its stderr is above)")
    rows = []
    for label, cpu, spins, proc in workers:
        spinners = [_spinner(s) for s in spins]
        time.sleep(0.3 if spinners else 0.05)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        result = _json_line(proc, "kernel")
        for s in spinners:
            s.kill()
            s.wait()
        proc.wait()
        row = {"case": case, "config": label, "cpu": cpu, "spinners": spins, **(result or {})}
        rows.append(row)
        print(json.dumps({k: row.get(k) for k in ("case", "config", "cpu_at_start")}
                         | {"kernel_ms": (row.get("kernel") or {}).get("ms"),
                            "eager_ms": (row.get("eager") or {}).get("ms")}), flush=True)
    return rows


def main(out: str, cases: list[str]) -> None:
    facts = topology()
    cpus = facts["cpus"]
    group = {c: sorted(parse_cpulist(facts["siblings"][c]) or {c}) for c in cpus}
    first_threads = [c for c in cpus if c == group[c][0]]
    others = [c for c in cpus if c not in first_threads]
    sib = {c: [x for x in group[c] if x != c] for c in cpus}
    facts["cpu_pairs"] = [cpu_pairs(t, cpus) for t in dict.fromkeys([cpus[0], cpus[len(cpus) // 2]])]
    print(json.dumps(facts["cpu_pairs"]), flush=True)
    rows = []
    for case in cases:
        c0 = first_threads[0] if first_threads else cpus[0]
        far = next((c for c in first_threads if c != c0), cpus[-1])
        batches = [
            [("unpinned", None, [])] * 6,
            [(f"cpu{c}", c, []) for c in first_threads[:8]],
            [(f"cpu{c}", c, []) for c in (first_threads[8:] + others)[:8]],
            [("sib-spin", c0, sib[c0][:1] or [far]), ("core-spin", c0, [far]), ("load3", None, [None] * 3),
             ("load8", None, [None] * 8), ("unpinned", None, []), ("sib-spin", far, sib[far][:1] or [c0])],
        ]
        for batch in batches:
            if batch:
                rows += run_batch(case, batch)
    Path(out).write_text(json.dumps({"topology": facts, "rows": rows}, indent=1))


if __name__ == "__main__":
    if sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], int(sys.argv[4]) if sys.argv[4] else None)
    else:
        main(sys.argv[1], sys.argv[2:])
