"""The processes of one evaluation: referee, candidate and eager harness, their pipes and their supervision.

A Launch starts the processes before the grading is known: each child imports torch (the bulk of a
cold start) and then waits for its spec on a pipe of its own. An Evaluation hands a Launch its problem
and kernel, waits for the verdict under the startup allowance and the hard timeout, kills every
process group at the end, and turns what happened into a verdict dict for grade().

Spares: while a grading runs, `launched` starts the next Launch of the same kind, so the next grading
finds its processes with torch already imported. Each process still serves exactly one grading; a
spare is only started earlier. Spares are keyed by everything their start depends on (device,
timing, network isolation, GPU pinning, limits, environment) and are killed when the judge's process
exits; a spare whose parent vanishes reads end-of-file on its spec pipe and exits.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import logging
import os
import select
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from mkb.judge import sandbox
from mkb.records import Dsl, Status
from mkb.settings import Settings, environment

STARTUP_S = 180.0
"""Time the judge processes get to start (import torch, initialise CUDA) before the timeout clock runs."""
LOG_TAIL_CHARS = 8000
MAX_SPARES = 16
"""Spare Launches kept at most, over all kinds (a protocol run has one kind per GPU)."""
_HERE = Path(__file__).resolve().parent
log = logging.getLogger(__name__)
_SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL")


@dataclass(frozen=True)
class Plan:
    """What a grading's processes need before its problem and kernel are known: the key of a spare."""

    device: str
    timed: bool
    """Whether an eager harness is started (GPU timing)."""
    isolate_network: bool
    visible_devices: str | None
    memory_mb: int
    timeout_s: float
    output_limit_bytes: int
    environment: str
    """A digest of the environment the children start with."""

    @classmethod
    def of(cls, settings: Settings, device: str, timed: bool, isolate_network: bool,
           visible_devices: str | None) -> Plan:
        env = json.dumps(sorted(environment().items())).encode()
        return cls(device, timed, isolate_network, visible_devices, settings.judge_memory_mb,
                   settings.judge_timeout_s, settings.judge_output_limit_bytes, hashlib.sha256(env).hexdigest())

    @property
    def names(self) -> list[str]:
        return ["referee", "candidate"] + (["eager"] if self.timed else [])


class Launch:
    """The started processes of one grading, each waiting for its spec; pipes wired, workdir private."""

    def __init__(self, plan: Plan):
        self.plan, self.started = plan, time.monotonic()
        shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        self.workdir = tempfile.mkdtemp(prefix="mkb-judge-", dir=shm)
        self.stage = Path(self.workdir, "kernel")
        self.stage.mkdir()
        self.pipes: dict[str, tuple] = {}
        self.children: dict[str, sandbox.Child] = {}
        for name in plan.names[1:]:
            self.pipes[name] = (os.pipe(), os.pipe())  # (referee -> child), (child -> referee)
        ready, go = {name: os.pipe() for name in plan.names}, {name: os.pipe() for name in plan.names}
        self.ready_fd = {name: w for name, (_, w) in ready.items()}
        """Each child's end of its readiness pipe (the number it has in the child)."""
        self.ready = {name: r for name, (r, _) in ready.items()}
        """The parent's ends of the readiness pipes, open until close()."""
        self._go = {name: w for name, (_, w) in go.items()}
        self._go_child = {name: r for name, (r, _) in go.items()}
        try:
            self._start("referee", [sys.executable, "-c", "from mkb.judge.referee import main; "
                                    "from mkb.judge.wire import leave; leave(main())"],
                        self._referee_fds(), cwd=self.workdir)
            for name in plan.names[1:]:
                to_child, from_child = self.pipes[name]
                self._start(name, [sys.executable, str(_HERE / "child.py")],
                            (to_child[0], from_child[1], self.ready_fd[name]), cwd=str(self.stage))
        finally:
            self._close_child_ends()
            if len(self.children) < len(plan.names):  # a start failed: leave nothing behind
                self.close()

    def _referee_fds(self) -> tuple[int, ...]:
        fds = [self.ready_fd["referee"]]
        for to_child, from_child in self.pipes.values():
            fds += [to_child[1], from_child[0]]
        return tuple(fds)

    def _start(self, name: str, argv: list[str], fds: tuple[int, ...], cwd: str) -> None:
        plan, candidate = self.plan, name == "candidate"
        limits = sandbox.Limits(memory_mb=plan.memory_mb, watch_rss=plan.device == "cuda",
                                cpu_s=int(plan.timeout_s + STARTUP_S) * (os.cpu_count() or 1) if candidate else None,
                                file_bytes=(1 << 30) if candidate else None,
                                isolate_network=candidate and plan.isolate_network)
        env = _child_env(candidate, self.workdir)
        if plan.visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = plan.visible_devices
        output_limit = plan.output_limit_bytes if candidate else 64 << 20
        go = self._go_child[name]
        self.children[name] = sandbox.start(name, [*argv, str(Path(self.workdir, f"{name}.json")), str(go)],
                                            env=env, cwd=cwd, limits=limits, pass_fds=(*fds, go),
                                            output_limit=output_limit)

    def _close_child_ends(self) -> None:
        """The parent keeps no pipe ends the children use: a dead peer then reads as end-of-file."""
        for to_child, from_child in self.pipes.values():
            for fd in (*to_child, *from_child):
                os.close(fd)
        for fd in (*self.ready_fd.values(), *self._go_child.values()):
            os.close(fd)

    def alive(self) -> bool:
        return bool(self.children) and all(c.popen.poll() is None for c in self.children.values())

    def begin(self, specs: dict[str, dict]) -> None:
        """Write each child's spec and let it go (a child that has died is found by the supervision)."""
        for name, spec in specs.items():
            Path(self.workdir, f"{name}.json").write_text(json.dumps(spec))
        for name in specs:
            try:
                os.write(self._go[name], b"g")
            except OSError:  # the child is gone; supervision reports it
                pass
            os.close(self._go.pop(name))

    def close(self) -> None:
        """Kill every process group, reap, close the parent's pipe ends and remove the workdir."""
        for child in self.children.values():
            if child.popen.poll() is None:
                child.kill()
            child.popen.wait()
        for child in self.children.values():  # the drain threads close the output pipes at end-of-file
            child.stdout.thread.join(2.0)
            child.stderr.thread.join(2.0)
        for fd in (*self.ready.values(), *self._go.values()):
            os.close(fd)
        self.ready.clear()
        self._go.clear()
        shutil.rmtree(self.workdir, ignore_errors=True)


_SPARES: dict[Plan, list[Launch]] = {}
_IN_FLIGHT: Counter[Plan] = Counter()
_SPARES_LOCK = threading.Lock()


@contextlib.contextmanager
def launched(plan: Plan, keep_spare: bool) -> Iterator[tuple[Launch, float | None]]:
    """The Launch for one grading and, when it is a spare, how many seconds ahead it was started.

    With keep_spare, a Launch of this plan is started now for a grading to come, unless as many
    spares as gradings of this plan in flight are already waiting (concurrent graders of one GPU
    each find one).
    """
    with _SPARES_LOCK:
        waiting = _SPARES.setdefault(plan, [])
        spare = waiting.pop(0) if waiting else None
        _IN_FLIGHT[plan] += 1
        wanted = keep_spare and len(waiting) < _IN_FLIGHT[plan]
    try:
        if spare is not None and not spare.alive():
            spare.close()
            spare = None
        launch = spare or Launch(plan)
        if wanted:
            _start_spare(plan)
        yield launch, (round(time.monotonic() - spare.started, 3) if spare else None)
    finally:
        with _SPARES_LOCK:
            _IN_FLIGHT[plan] -= 1


def _start_spare(plan: Plan) -> None:
    try:
        launch = Launch(plan)
    except OSError as exc:  # out of processes or pipes: this grading goes on, a later one starts cold
        log.warning("could not start spare judge processes: %s", exc)
        return
    evicted = []
    with _SPARES_LOCK:
        _SPARES.setdefault(plan, []).append(launch)
        while sum(len(waiting) for waiting in _SPARES.values()) > MAX_SPARES:  # the oldest of other kinds go
            other = next((p for p, waiting in _SPARES.items() if waiting and p != plan), plan)
            evicted.append(_SPARES[other].pop(0))
    for spare in evicted:
        spare.close()


@atexit.register
def discard_spares() -> None:
    """Kill every spare (at exit, and for callers that want no processes left behind)."""
    with _SPARES_LOCK:
        spares = [launch for waiting in _SPARES.values() for launch in waiting]
        _SPARES.clear()
    for spare in spares:
        spare.close()


class Evaluation:
    """One grading on a Launch: the specs, the supervision and the verdict."""

    def __init__(self, launch: Launch, problem, kernel: Path, dsl: Dsl, timing: str, scale: str,
                 pin_cpus: bool = False):
        plan = launch.plan
        self.launch, self.device, self.start_s = launch, plan.device, None
        self.children, self.ready = launch.children, launch.ready
        shutil.copyfile(kernel, launch.stage / "kernel.py")
        common = {"device": plan.device, "workdir": launch.workdir}
        r_spec = {**common, "problem": problem.model_dump(mode="json"), "dsl": str(dsl), "scale": scale,
                  "timing": timing if plan.timed else "none", "ready_fd": launch.ready_fd["referee"],
                  "pin_cpus": pin_cpus}
        specs = {}
        for name, prefix in (("candidate", "c"), ("eager", "e")):
            if name in launch.pipes:
                (to_child, from_child) = launch.pipes[name]
                r_spec.update({f"{prefix}_cmd_w": to_child[1], f"{prefix}_reply_r": from_child[0]})
                specs[name] = {**common, "role": "candidate" if name == "candidate" else "reference",
                               "dsl": str(dsl), "kernel": str(launch.stage / "kernel.py"),
                               "problem": problem.path if name == "eager" else None,
                               "cmd_fd": to_child[0], "reply_fd": from_child[1], "ready_fd": launch.ready_fd[name]}
        launch.begin({"referee": r_spec, **specs})

    def supervise(self, timeout_s: float, now: Callable[[], float]) -> tuple[dict, dict, str]:
        """Wait for the verdict under the startup and hard timeouts; kill everything at the end."""
        try:
            started = now()
            outcome = self._wait_ready(now)
            self.start_s = round(now() - started, 3)
            outcome = outcome or self._wait_verdict(timeout_s, now)
        finally:
            self.launch.close()
        return self._verdict(outcome, timeout_s)

    def _wait_ready(self, now) -> str | None:
        """None once every process is ready, or once the referee has finished: a fast verdict (an import
        error, say) can come before the eager harness, needed only for timing, has finished starting."""
        pending, deadline = {r: n for n, r in self.ready.items()}, now() + STARTUP_S
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
