"""The processes of one evaluation: referee, candidate and eager harness, their pipes and their supervision.

Wires the pipes (referee <-> each harness, each child -> parent readiness), starts every child in
its own session with its limits (sandbox.py), waits for the verdict under the startup allowance
and the hard timeout, kills every process group at the end, and turns what happened into a
verdict dict for grade().
"""

from __future__ import annotations

import json
import os
import select
import shutil
import sys
from pathlib import Path
from typing import Callable

from mkb.judge import sandbox
from mkb.records import Dsl, Status
from mkb.settings import Settings, environment

STARTUP_S = 180.0
"""Time the judge processes get to start (import torch, initialise CUDA) before the timeout clock runs."""
LOG_TAIL_CHARS = 8000
_HERE = Path(__file__).resolve().parent
_SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL")


class Evaluation:
    """The processes of one grading and their pipes."""

    def __init__(self, problem, kernel: Path, dsl: Dsl, device: str, timing: str, scale: str,
                 settings: Settings, workdir: str, isolate_network: bool = True, visible_devices: str | None = None):
        self.settings, self.workdir, self.device = settings, workdir, device
        self.isolate_network, self.visible_devices, self.start_s = isolate_network, visible_devices, None
        stage = Path(workdir, "kernel")
        stage.mkdir()
        shutil.copyfile(kernel, stage / "kernel.py")
        self.pipes, self.ready = {}, {}
        self.children: dict[str, sandbox.Child] = {}
        names = ["referee", "candidate"] + (["eager"] if timing != "none" else [])
        for name in names[1:]:
            self.pipes[name] = (os.pipe(), os.pipe())  # (referee -> child), (child -> referee)
        for name in names:
            self.ready[name] = os.pipe()
        common = {"device": device, "workdir": workdir}
        r_spec = {**common, "problem": problem.model_dump(mode="json"), "dsl": str(dsl), "scale": scale,
                  "timing": timing, "ready_fd": self.ready["referee"][1]}
        for name, prefix in (("candidate", "c"), ("eager", "e")):
            if name in self.pipes:
                (to_child, from_child) = self.pipes[name]
                r_spec.update({f"{prefix}_cmd_w": to_child[1], f"{prefix}_reply_r": from_child[0]})
        self._start("referee", [sys.executable, "-c", "import sys; from mkb.judge.referee import main; "
                                "sys.exit(main())"], r_spec, self._referee_fds(), cwd=workdir)
        for name in names[1:]:
            to_child, from_child = self.pipes[name]
            spec = {**common, "role": "candidate" if name == "candidate" else "reference", "dsl": str(dsl),
                    "kernel": str(stage / "kernel.py"), "problem": problem.path if name == "eager" else None,
                    "cmd_fd": to_child[0], "reply_fd": from_child[1], "ready_fd": self.ready[name][1]}
            self._start(name, [sys.executable, str(_HERE / "child.py")], spec,
                        (to_child[0], from_child[1], self.ready[name][1]), cwd=str(stage))
        self._close_child_ends()

    def _referee_fds(self) -> tuple[int, ...]:
        fds = [self.ready["referee"][1]]
        for to_child, from_child in self.pipes.values():
            fds += [to_child[1], from_child[0]]
        return tuple(fds)

    def _start(self, name: str, argv: list[str], spec: dict, fds: tuple[int, ...], cwd: str) -> None:
        spec_path = Path(self.workdir, f"{name}.json")
        spec_path.write_text(json.dumps(spec))
        s = self.settings
        candidate = name == "candidate"
        limits = sandbox.Limits(memory_mb=s.judge_memory_mb, watch_rss=self.device == "cuda",
                                cpu_s=int(s.judge_timeout_s + STARTUP_S) * (os.cpu_count() or 1) if candidate else None,
                                file_bytes=(1 << 30) if candidate else None,
                                isolate_network=candidate and self.isolate_network)
        env = _child_env(candidate, self.workdir)
        if self.visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.visible_devices
        output_limit = s.judge_output_limit_bytes if candidate else 64 << 20
        self.children[name] = sandbox.start(name, [*argv, str(spec_path)], env=env, cwd=cwd, limits=limits,
                                            pass_fds=fds, output_limit=output_limit)

    def _close_child_ends(self) -> None:
        """The parent keeps no pipe ends: a dead peer then reads as end-of-file."""
        for to_child, from_child in self.pipes.values():
            for fd in (*to_child, *from_child):
                os.close(fd)
        for _, w in self.ready.values():
            os.close(w)

    def supervise(self, timeout_s: float, now: Callable[[], float]) -> tuple[dict, dict, str]:
        """Wait for the verdict under the startup and hard timeouts; kill everything at the end."""
        try:
            started = now()
            outcome = self._wait_ready(now)
            self.start_s = round(now() - started, 3)
            outcome = outcome or self._wait_verdict(timeout_s, now)
        finally:
            for child in self.children.values():
                if child.popen.poll() is None:
                    child.kill()
                child.popen.wait()
            for r, _ in self.ready.values():
                os.close(r)
        return self._verdict(outcome, timeout_s)

    def _wait_ready(self, now) -> str | None:
        """None once every process is ready, or once the referee has finished: a fast verdict (an import
        error, say) can come before the eager harness, needed only for timing, has finished starting."""
        pending, deadline = {r: n for n, (r, _) in self.ready.items()}, now() + STARTUP_S
        while pending and now() < deadline:
            readable, _, _ = select.select(list(pending), [], [], 0.2)
            for fd in readable:
                os.read(fd, 16)
                del pending[fd]
            if pending and self.children["referee"].popen.poll() is not None and "referee" not in pending.values():
                return None
            if any(c.popen.poll() is not None for c in self.children.values()) and pending:
                return "startup_died"
        return "startup_timeout" if pending else None

    def _wait_verdict(self, timeout_s: float, now) -> str:
        referee, candidate = self.children["referee"], self.children["candidate"]
        deadline = now() + timeout_s
        while now() < deadline:
            try:
                referee.popen.wait(timeout=0.05)
            except Exception:  # subprocess.TimeoutExpired: still working
                if candidate.over_memory():
                    return "memory"
                continue
            try:
                candidate.popen.wait(timeout=5)
            except Exception:  # the candidate ignored 'finish'; it is killed below
                pass
            return "done"
        return "timeout"

    def _verdict(self, outcome: str, timeout_s: float) -> tuple[dict, dict, str]:
        referee, candidate = self.children["referee"], self.children["candidate"]
        log_tail = candidate.stderr.text(max_bytes=LOG_TAIL_CHARS)
        details = {"isolation": candidate.isolation, "processes": {n: c.describe_exit() for n, c in self.children.items()},
                   "candidate_output_bytes": candidate.stderr.total + candidate.stdout.total,
                   "processes_start_s": self.start_s}
        verdict = _last_json(referee.stdout.text())
        reported = _last_json(candidate.stdout.text())
        if outcome == "timeout":
            return {"status": Status.TIMEOUT, "message": f"the evaluation exceeded its {timeout_s:g} s limit and was "
                                                        f"killed"}, details, log_tail
        if outcome == "memory":
            return {"status": Status.CRASHED, "message": f"the candidate exceeded the {candidate.limits.memory_mb} MiB "
                                                        f"memory limit and was killed"}, details, log_tail
        if outcome.startswith("startup"):
            return {"status": Status.INFRA_ERROR, "message": f"judge processes failed to start ({outcome}): "
                    f"{referee.stderr.text()[-500:]} {log_tail[-500:]}"}, details, log_tail
        if verdict is None:
            if candidate.popen.returncode not in (0, None):
                return {"status": Status.CRASHED, "message": f"the candidate process {candidate.describe_exit()}"}, \
                    details, log_tail
            return {"status": Status.INFRA_ERROR, "message": f"the referee {referee.describe_exit()} without a "
                    f"verdict: {referee.stderr.text()[-1500:]}"}, details, log_tail
        details.update(verdict.pop("details", {}))
        details.setdefault("candidate", reported)
        if phase := details.pop("candidate_died", None):
            verdict["message"] = f"the candidate process {candidate.describe_exit()} during {phase}"
        if verdict["status"] == Status.INFRA_ERROR:
            details["referee_log"] = referee.stderr.text()[-4000:]
        return verdict, details, log_tail


def _child_env(candidate: bool, workdir: str) -> dict:
    env = environment()
    root = str(_HERE.parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
    if candidate:
        env = {k: v for k, v in env.items() if not any(m in k.upper() for m in _SECRET_MARKERS)
               and not k.startswith("MKB_")}
        env.pop("PYTHONPATH", None)
        env["TMPDIR"] = workdir
    return env


def _last_json(text: str) -> dict | None:
    for line in reversed(text.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None
