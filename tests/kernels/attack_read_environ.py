"""Hostile: reads the environment and command line of every process it can see (/proc/*/environ: the runner's API keys, the referee's) and raises with them.

In the sandbox it sees only itself and the sandbox's init, whose environment is the harness's own
allow-listed one.

Problem: p28
DSL: cutedsl
Device: cpu
Expected: runtime_error
Also: policy_violation
"""
import os


def solve(x, residual, weight):
    seen = [f"self: {sorted(os.environ)}"]
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
    for pid in pids + [str(os.getppid())]:
        for part in ("environ", "cmdline"):
            try:
                with open(f"/proc/{pid}/{part}", "rb") as fh:
                    seen.append(f"{pid}/{part}: " + fh.read().replace(b"\0", b" ").decode(errors="replace"))
            except OSError as exc:
                seen.append(f"{pid}/{part}: {exc.strerror}")
    raise RuntimeError(f"{len(pids)} processes visible; " + " || ".join(seen))
