"""The processes of one grading, started before the grading is known: referee, candidate, eager harness.

A Launch starts the referee in a fresh grading namespace (sandbox.py) and each harness in a cell
of that namespace; each child imports torch (the bulk of a cold start) and then waits for its spec
on a go pipe of its own. evaluation.py hands a Launch its problem and kernel and supervises it.
Every process serves exactly one grading. With the explicit unsafe setting and no sandbox, the
same processes start as plain subprocesses.

Reliefs: each Launch also holds the pipes of RELIEFS candidate processes not yet started. When a candidate
dies inside a knocked-out draw (referee/knockout.py), the judge's parent starts a fresh candidate on one of
them (start_relief) and the referee goes on with it; the referee had their ends from its start.

Spares: while a grading runs, `launched` starts the next Launch of the same kind, so the next grading
finds its processes with torch already imported. Spares are keyed by everything their start depends
on (device, timing, sandbox, GPU pinning, limits, environment) and are killed when the judge's
process exits; a spare whose parent vanishes reads end-of-file on its go pipe and exits.
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
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from mkb.judge import credentials, leftovers, processes, sandbox
from mkb.judge.view import HARNESS_ROOT, KERNEL_ROOT, PROBLEM_ROOT, View
from mkb.settings import Settings, environment

STARTUP_S = 180.0
"""Time the judge processes get to start (import torch, initialise CUDA) before the timeout clock runs."""
MAX_SPARES = 16
"""Spare Launches kept at most, over all kinds (a protocol run has one kind per GPU)."""
MAX_PROCESSES, MAX_THREADS = 64, 4096
"""Processes (a DSL's compiler runs a few) and threads (torch's pools: a few per core) a candidate's tree may hold."""
JAIL_START_S = 60.0
RELIEFS = 2
"""Fresh candidate processes one grading may start after its candidate died inside a knocked-out draw: one per
poison of the knock-out (referee/knockout.POISONS; tests/test_judge.py holds them equal)."""
HARNESS_DIR = Path(__file__).resolve().parent / "candidate"
CHECKOUT = Path(__file__).resolve().parents[2]
REFEREE = ("import os, sys; fd = int(sys.argv[3]); os.write(fd, str(os.getpid()).encode()); os.close(fd)\n"
           "from mkb.judge.referee.referee import main\nfrom mkb.judge.candidate.wire import leave\nleave(main())")
"""The referee's command: first tell the judge which process holds the grading's namespace."""
log = logging.getLogger(__name__)


class LaunchError(Exception):
    """The grading's processes could not be started (the judge's trouble: no kernel code has run)."""


@dataclass(frozen=True)
class Plan:
    """What a grading's processes need before its problem and kernel are known: the key of a spare."""

    device: str
    timed: bool
    """Whether an eager harness is started (GPU timing)."""
    sandboxed: bool
    """False only when the user asked for no sandbox (settings.judge_unsafe_no_sandbox) and none works."""
    visible_devices: str | None
    memory_mb: int
    timeout_s: float
    output_limit_bytes: int
    tmpfs_mb: int
    private: tuple[str, ...]
    """Host paths no cell may show: the checkout, MKB_HOME, problems, solutions, the home directory."""
    environment: str
    """A digest of the environment the children start with."""
    extra_paths: tuple[str, ...] = ()
    """Site directories the candidate's cell shows read-only, first on its PYTHONPATH: a trusted anchor's library
    (mkb.judge.anchor); empty for every other grading."""

    @classmethod
    def of(cls, settings: Settings, device: str, timed: bool, sandboxed: bool, visible_devices: str | None,
           extra_paths: tuple[str, ...] = ()) -> Plan:
        env = json.dumps(sorted(credentials.judge_environment(environment(), trusted=True).items())).encode()
        private = (CHECKOUT, settings.home, settings.problems_dir, settings.solutions_path, Path.home())
        return cls(device, timed, sandboxed, visible_devices, settings.judge_memory_mb, settings.judge_timeout_s,
                   settings.judge_output_limit_bytes, settings.judge_tmpfs_mb, tuple(str(p) for p in private),
                   hashlib.sha256(env).hexdigest(), tuple(extra_paths))

    @property
    def tmpfs_bytes(self) -> int:
        """Size of each of the grading's tmpfs mounts: the setting, never above the memory limit."""
        return min(self.tmpfs_mb, self.memory_mb) << 20

    @property
    def names(self) -> list[str]:
        return ["referee", "candidate"] + (["eager"] if self.timed else [])


class Launch:
    """The started processes of one grading, each waiting for its spec; pipes wired, working folder private."""

    def __init__(self, plan: Plan):
        self.plan, self.started = plan, time.monotonic()
        self.sandbox = sandbox.find()[0] if plan.sandboxed else None
        if plan.sandboxed and self.sandbox is None:
            raise LaunchError(f"no OS sandbox: {sandbox.find()[1]}")
        self.hostdir = leftovers.owned_dir("judge")
        self.id = self.hostdir.name
        self.stage = {"candidate": self.hostdir / "kernel", "eager": self.hostdir / "problem"}
        for folder in (*self.stage.values(), self.hostdir / "tmp"):
            folder.mkdir()
        self.pipes = {name: (os.pipe(), os.pipe()) for name in plan.names[1:]}  # (to child, from child)
        ready, go = {name: os.pipe() for name in plan.names}, {name: os.pipe() for name in plan.names}
        self.ready_fd = {name: w for name, (_, w) in ready.items()}
        """Each child's end of its readiness pipe (the number it has in the child)."""
        self.ready = {name: r for name, (r, _) in ready.items()}
        """The parent's ends of the readiness pipes, open until close()."""
        self.signals = {name: b"" for name in plan.names}
        """What each child wrote on its readiness pipe so far ('ready'; the referee 'L' when the kernel loads)."""
        self._go = {name: w for name, (_, w) in go.items()}
        self._go_child = {name: r for name, (r, _) in go.items()}
        self._control_child, self.control = os.pipe()
        """The parent's end of the referee's control pipe: its answer once the candidate's processes are gone."""
        self.fds = {name: {"ready_fd": self.ready_fd[name]} for name in plan.names}
        """The numbers each child has for its pipes, for its spec."""
        self.fds["referee"]["control_fd"] = self._control_child
        for name, (prefix, (to_child, from_child)) in zip(plan.names[1:], zip("ce", self.pipes.values())):
            self.fds["referee"].update({f"{prefix}_cmd_w": to_child[1], f"{prefix}_reply_r": from_child[0]})
            self.fds[name].update(cmd_fd=to_child[0], reply_fd=from_child[1])
        self.reliefs: list[dict[str, int]] = []
        """Each relief's pipes not yet handed over: the child's ends (cmd_fd, reply_fd, ready_fd, go_fd) and the
        parent's (ready, go); the referee's ends (r<i>_cmd_w, r<i>_reply_r) are in its spec and closed here once
        it has started."""
        self._referee_relief_ends: list[int] = []
        for i in range(RELIEFS):
            (cmd_r, cmd_w), (reply_r, reply_w), (ready_r, ready_w), (go_r, go_w) = (os.pipe() for _ in range(4))
            self.reliefs.append({"cmd_fd": cmd_r, "reply_fd": reply_w, "ready_fd": ready_w, "go_fd": go_r,
                                 "ready": ready_r, "go": go_w})
            self.fds["referee"].update({f"r{i}_cmd_w": cmd_w, f"r{i}_reply_r": reply_r})
            self._referee_relief_ends += [cmd_w, reply_r]
        self.relieved: list[processes.Child] = []
        """Candidates a relief replaced (dead), kept to be reaped by close()."""
        self.jail_pid: int | None = None
        self.children: dict[str, processes.Child] = {}
        try:
            self.jail_pid = self._start_referee()
            for name in plan.names[1:]:
                self._start_harness(name, {**self.fds[name], "go_fd": self._go_child[name]})
        except BaseException:
            self.close()
            raise
        finally:
            self._close_child_ends()

    def _start_referee(self) -> int:
        """Start the referee in a fresh grading namespace; the pid of the process holding that namespace."""
        jail_r, jail_w = os.pipe()
        fds = [self.ready_fd["referee"], self._go_child["referee"], self._control_child, jail_w,
               *self._referee_relief_ends]
        for to_child, from_child in self.pipes.values():
            fds += [to_child[1], from_child[0]]
        argv = [sys.executable, "-c", REFEREE, str(self._go_child["referee"]), self.id, str(jail_w)]
        if self.sandbox is not None:
            argv = self.sandbox.jail_argv(self.plan.tmpfs_bytes) + argv
        env = credentials.judge_environment(environment(), trusted=True)
        env["PYTHONPATH"] = str(CHECKOUT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        try:
            self._start("referee", argv, env, tuple(fds), processes.Limits(), cwd=str(self.hostdir))
        finally:
            os.close(jail_w)
        try:
            return self._read_pid(jail_r)
        finally:
            os.close(jail_r)

    def _read_pid(self, fd: int) -> int:
        data, deadline = b"", time.monotonic() + JAIL_START_S
        while time.monotonic() < deadline:
            if select.select([fd], [], [], 0.5)[0]:
                chunk = os.read(fd, 64)
                if not chunk:
                    break
                data += chunk
        if not data.isdigit():
            referee = self.children["referee"]
            raise LaunchError(f"the grading's namespace did not start (the referee {referee.describe_exit()}): "
                              f"{referee.stderr.text(wait_s=1.0)[-600:].strip()}")
        return int(data)

    def _start_harness(self, name: str, fds: dict[str, int]) -> None:
        """Start the candidate or eager harness in a cell of the grading's namespace; fds: the numbers of its
        pipe ends (cmd_fd, reply_fd, ready_fd, go_fd)."""
        plan, candidate, jail_pid = self.plan, name == "candidate", self.jail_pid
        env = credentials.judge_environment(environment(), trusted=False)
        env.update(PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
        if self.sandbox is None:
            env.update(HOME=str(self.hostdir / "tmp"), TMPDIR=str(self.hostdir / "tmp"))
            if candidate and plan.extra_paths:
                env["PYTHONPATH"] = os.pathsep.join([*plan.extra_paths, *filter(None, [env.get("PYTHONPATH")])])
            argv, isolation = [sys.executable, str(HARNESS_DIR / "child.py")], {
                "sandbox": "none: MKB_JUDGE_UNSAFE_NO_SANDBOX is set; the harness sees the host's files, processes "
                           "and network"}
        else:
            view = View.for_harness(harness_dir=str(HARNESS_DIR), stage=str(self.stage[name]),
                                    stage_root=KERNEL_ROOT if candidate else PROBLEM_ROOT,
                                    gpu=plan.device == "cuda", visible_devices=plan.visible_devices,
                                    tmp_bytes=plan.tmpfs_bytes, private=tuple(Path(p) for p in plan.private),
                                    extra=plan.extra_paths if candidate else ())
            env.update(HOME="/tmp", TMPDIR="/tmp")
            if view.pythonpath:
                env["PYTHONPATH"] = os.pathsep.join(view.pythonpath)
            argv = [*self.sandbox.cell_argv(jail_pid, view, as_pid_1=not candidate), sys.executable,
                    f"{HARNESS_ROOT}/child.py"]
            isolation = {**self.sandbox.describe(plan.tmpfs_bytes >> 20), "network": "none (own network namespace)",
                         "devices": ", ".join(view.devices) or "no GPU nodes"}
        limits = processes.Limits(
            memory_mb=plan.memory_mb if candidate else None, address_space=plan.device == "cpu",
            cpu_s=int(plan.timeout_s + STARTUP_S) * (os.cpu_count() or 1) if candidate else None,
            file_bytes=(1 << 30) if candidate else None, max_processes=MAX_PROCESSES if candidate else None,
            max_threads=MAX_THREADS if candidate else None)
        self._start(name, [*argv, str(fds["go_fd"]), self.id], env,
                    tuple(fds[k] for k in ("cmd_fd", "reply_fd", "ready_fd", "go_fd")), limits, isolation=isolation)

    def _start(self, name: str, argv: list[str], env: dict, fds: tuple[int, ...], limits: processes.Limits,
               cwd: str = "/", isolation: dict | None = None) -> None:
        if self.plan.visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.plan.visible_devices
        env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # CUDA's indices as nvidia-smi's (view.visible_minors)
        output_limit = self.plan.output_limit_bytes if name == "candidate" else 64 << 20
        self.children[name] = processes.start(name, argv, env=env, cwd=cwd, limits=limits, pass_fds=fds,
                                              output_limit=output_limit, isolation=isolation or {},
                                              sandboxed=self.sandbox is not None)

    def _close_child_ends(self) -> None:
        """The parent keeps no pipe ends the children use: a dead peer then reads as end-of-file."""
        for to_child, from_child in self.pipes.values():
            for fd in (*to_child, *from_child):
                os.close(fd)
        for fd in (*self.ready_fd.values(), *self._go_child.values(), self._control_child, *self._referee_relief_ends):
            os.close(fd)
        self.pipes, self.ready_fd, self._go_child, self._control_child = {}, {}, {}, None
        self._referee_relief_ends = []

    def start_relief(self, spec: dict) -> processes.Child:
        """Start a fresh candidate harness on the next relief's pipes and hand it spec (the candidate's, with the
        relief's pipe numbers); it replaces children["candidate"], whose process must already be gone.

        Raises:
            LaunchError: every relief was used.
        """
        if not self.reliefs:
            raise LaunchError(f"all {RELIEFS} fresh candidate processes of this grading were used")
        slot = self.reliefs.pop(0)
        mine = {"cmd_fd": slot["cmd_fd"], "reply_fd": slot["reply_fd"], "ready_fd": slot["ready_fd"]}
        try:
            self.relieved.append(self.children.pop("candidate"))
            self._start_harness("candidate", {**mine, "go_fd": slot["go_fd"]})
        finally:
            for fd in (*mine.values(), slot["go_fd"]):
                os.close(fd)
        os.close(self.ready.pop("candidate"))
        self.ready["candidate"], self.signals["candidate"] = slot["ready"], b""
        _hand_over({**spec, **mine}, slot["go"])
        return self.children["candidate"]

    def alive(self) -> bool:
        return bool(self.children) and all(c.popen.poll() is None for c in self.children.values())

    def begin(self, specs: dict[str, dict]) -> None:
        """Write each child's spec (with its pipes' numbers) on its go pipe and close it (a child that has died
        is found by the supervision)."""
        for name, spec in specs.items():
            _hand_over({**spec, **self.fds[name]}, self._go.pop(name))

    def close(self) -> None:
        """Kill every process group, reap, close the parent's pipe ends and remove the working folder."""
        everyone = [*self.children.values(), *self.relieved]
        for child in everyone:
            if child.popen.poll() is None:
                child.kill()
            child.popen.wait()
        for child in everyone:  # the drain threads close the output pipes at end-of-file
            child.stdout.thread.join(2.0)
            child.stderr.thread.join(2.0)
        for fd in (*self.ready.values(), *self._go.values(), *([self.control] if self.control is not None else [])):
            os.close(fd)
        for slot in self.reliefs:
            for fd in slot.values():
                os.close(fd)
        self.ready.clear()
        self._go.clear()
        self.reliefs = []
        self.control = None
        shutil.rmtree(self.hostdir, ignore_errors=True)


def _hand_over(spec: dict, go: int) -> None:
    """Write a child's spec (JSON) on its go pipe and close the pipe; a child that has died is found by the
    supervision (or, for a relief, by the referee, whose channel to it closes)."""
    try:
        data = json.dumps(spec).encode()
        while data:
            data = data[os.write(go, data):]
    except OSError:
        pass
    os.close(go)


_SPARES: dict[Plan, list[Launch]] = {}
_IN_FLIGHT: Counter[Plan] = Counter()
_SPARES_LOCK = threading.Lock()
_STARTING: list[threading.Thread] = []
"""Spare starts in progress (discard_spares waits for them)."""


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
        if wanted:  # on a thread: the namespaces take a few tens of milliseconds this grading need not wait for
            starting = threading.Thread(target=_start_spare, args=(plan,), name="mkb-judge-spare", daemon=True)
            with _SPARES_LOCK:
                _STARTING.append(starting)
            starting.start()
        yield launch, (round(time.monotonic() - spare.started, 3) if spare else None)
    finally:
        with _SPARES_LOCK:
            _IN_FLIGHT[plan] -= 1


def _start_spare(plan: Plan) -> None:
    try:
        launch = Launch(plan)
    except (OSError, LaunchError) as exc:  # out of processes or pipes: this grading goes on, a later one starts cold
        log.warning("could not start spare judge processes: %s", exc)
        launch = None
    evicted = []
    with _SPARES_LOCK:
        if threading.current_thread() in _STARTING:
            _STARTING.remove(threading.current_thread())
        if launch is not None:
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
        starting = list(_STARTING)
    for thread in starting:
        thread.join()
    with _SPARES_LOCK:
        spares = [launch for waiting in _SPARES.values() for launch in waiting]
        _SPARES.clear()
    for spare in spares:
        spare.close()
