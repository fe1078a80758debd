"""One grading on a Launch: the specs, the supervision under the time and resource limits, and the verdict.

Who is charged when something dies (the trusted side's rule is in referee/verdict.py):
- the processes failing to start, or the referee dying before it let kernel.py import, is the
  judge's (`infra_error`): no code of the candidate had run;
- the candidate process dying, or being killed by the watchdog (memory, processes), is `crashed`;
- a candidate that dies (or fails) inside a knocked-out draw is replaced by a fresh one when the referee asks
  ("R" on its readiness pipe: _relieve); the grading goes on, and the record keeps how it died
  (details.relieved);
- the referee dying without a verdict after it let kernel.py import is `crashed` as well: the
  referee says on its readiness pipe when the kernel starts to load ("L"), and from then on the
  kernel shares the machine with it (and in a sandbox cannot reach it any other way).
"""

from __future__ import annotations

import json
import os
import select
import shutil
from pathlib import Path
from typing import Callable

from mkb.judge import processes
from mkb.judge.launch import STARTUP_S, Launch, LaunchError
from mkb.judge.referee.verdict import CHARGED_NOTE
from mkb.judge.view import KERNEL_ROOT, PROBLEM_ROOT
from mkb.records import Dsl, Status

LOG_TAIL_CHARS = 8000
RELIEVED_LOG_CHARS = 2000
"""What a replaced candidate's log keeps, at its start and at its end (the CUDA error that killed it is often
before the abort's frames)."""
WATCH_EVERY_S = 0.25
"""How often the candidate's process tree is measured (memory, number of processes)."""
STOP_GRACE_S, STOP_WAIT_S = 2.0, 10.0
"""A candidate told to finish gets this long to exit by itself before it is killed; its processes then get
STOP_WAIT_S to vanish (the referee is told only once none is left)."""
TRANSPORT = "/dev/shm/mkb-transport"
"""Where a sandboxed referee keeps the files it shares on CPU: the grading's own /dev/shm."""


class Evaluation:
    """One grading on a Launch: the specs, the supervision and the verdict."""

    def __init__(self, launch: Launch, problem, kernel: Path, dsl: Dsl, timing: str, scale: str,
                 pin_cpus: bool = False, eager: str = "time", dsl_policy: str = "paper"):
        plan = launch.plan
        self.launch, self.device, self.start_s = launch, plan.device, None
        self.children = launch.children
        self.closed: set[str] = set()
        """Children whose readiness pipe reached end-of-file."""
        self.stops: list[dict] = []
        """The candidate's ends the referee asked for (_stop_candidate): at most one per grading."""
        self.reliefs: list[dict] = []
        """The candidates replaced by a fresh one (_relieve): how each ended, and its log's head and tail."""
        shutil.copyfile(kernel, launch.stage["candidate"] / "kernel.py")
        problem_file = Path(problem.path)
        shutil.copyfile(problem_file, launch.stage["eager"] / problem_file.name)
        boxed = launch.sandbox is not None
        r_spec = {"device": plan.device, "workdir": TRANSPORT if boxed else str(launch.hostdir / "transport"),
                  "problem": problem.model_dump(mode="json"), "dsl": str(dsl), "scale": scale,
                  "timing": timing if plan.timed else "none", "pin_cpus": pin_cpus, "eager": eager,
                  "dsl_policy": dsl_policy}
        specs = {}
        for name in ("candidate", "eager"):
            if name not in launch.children:
                continue
            stage = (KERNEL_ROOT if name == "candidate" else PROBLEM_ROOT) if boxed else str(launch.stage[name])
            specs[name] = {"device": plan.device, "workdir": "/tmp" if boxed else str(launch.hostdir / "tmp"),
                           "role": "candidate" if name == "candidate" else "reference", "dsl": str(dsl),
                           "kernel": f"{stage}/kernel.py" if name == "candidate" else None,
                           "problem": f"{stage}/{problem_file.name}" if name == "eager" else None}
        self.candidate_spec = specs.get("candidate")
        """What a relief candidate is given (with its own pipes' numbers)."""
        launch.begin({"referee": r_spec, **specs})

    def supervise(self, timeout_s: float, now: Callable[[], float]) -> tuple[dict, dict, str]:
        """Wait for the verdict under the startup and hard timeouts; kill everything at the end."""
        try:
            started = now()
            outcome = self._wait_ready(now)
            self.start_s = round(now() - started, 3)
            outcome = outcome or self._wait_verdict(timeout_s, now)
        finally:
            self._read_signals(0.0)
            self.ended = {name: child.popen.poll() for name, child in self.children.items()}
            """How each process had ended before the judge killed what was left (None: still running)."""
            self.launch.close()
        return self._verdict(outcome, timeout_s)

    def _read_signals(self, wait_s: float) -> None:
        """Read what the children wrote on their readiness pipes (waiting up to wait_s for something new)."""
        fds = {fd: name for name, fd in self.launch.ready.items() if name not in self.closed}
        for fd in select.select(list(fds), [], [], wait_s)[0]:  # with no fds left: a plain wait
            try:
                data = os.read(fd, 64)
            except OSError:
                data = b""
            self.launch.signals[fds[fd]] += data
            if not data:  # the child closed its end (or died): nothing more will come
                self.closed.add(fds[fd])

    def _wait_ready(self, now) -> str | None:
        """None once every process is ready, or once the referee has finished: a fast verdict (an import
        error, say) can come before the eager harness, needed only for timing, has finished starting."""
        deadline = now() + STARTUP_S
        while now() < deadline:
            self._read_signals(0.2)
            pending = [n for n, said in self.launch.signals.items() if not said.startswith(b"ready")]
            if not pending:
                return None
            if self.children["referee"].popen.poll() is not None and "referee" not in pending:
                return None
            if any(c.popen.poll() is not None for c in self.children.values()):
                # A fast grading can end before its readiness bytes were read (on a loaded host the candidate
                # exited 0 after the referee had said ready and finished): read what is left, then decide.
                for _ in range(16):
                    self._read_signals(0.0)
                said = self.launch.signals
                if any(c.popen.poll() is not None and not said[n].startswith(b"ready") for n, c in self.children.items()):
                    return "startup_died"
        return "startup_timeout"

    def _wait_verdict(self, timeout_s: float, now) -> str:
        referee, candidate = self.children["referee"], self.children["candidate"]
        deadline, watched = now() + timeout_s, 0.0
        while now() < deadline:
            try:
                referee.popen.wait(timeout=0.05)
            except Exception:  # subprocess.TimeoutExpired: still working
                self._read_signals(0.0)
                if self.launch.signals["referee"].count(b"S") > len(self.stops):
                    self._stop_candidate(now)
                if self.launch.signals["referee"].count(b"R") > len(self.reliefs):
                    self._relieve(now)
                    candidate = self.children["candidate"]
                if now() - watched >= WATCH_EVERY_S:
                    watched = now()
                    if (reason := candidate.over_limits()) is not None:
                        return f"limit:{reason}"
                continue
            try:
                candidate.popen.wait(timeout=5)
            except Exception:  # the candidate ignored 'finish'; it is killed below
                pass
            return "done"
        return "timeout"

    def _stop_candidate(self, now, grace_s: float = STOP_GRACE_S) -> None:
        """The referee asked for the candidate's end: let it exit, kill what is left, tell the referee when no
        process of the candidate remains (on the control pipe, one JSON line)."""
        started = now()
        by_itself, tree, left = self._end_candidate(grace_s)
        account = {"exited_by_itself": by_itself, "processes": len(tree), "left": len(left),
                   "stopped_s": round(now() - started, 3)}
        self.stops.append(account)
        if not left:
            self._answer_referee(account)

    def _relieve(self, now) -> None:
        """The referee saw the candidate die (or fail) inside a knocked-out draw and asked for a fresh one: end what
        is left of the old one, start a relief candidate (launch.start_relief) and tell the referee on its control
        pipe (one JSON line: relieved or not, and how the dead one ended)."""
        dead, started = self.children["candidate"], now()
        _, tree, left = self._end_candidate(0.0)
        account = {"exit": dead.describe_exit(), "processes": len(tree), "left": len(left)}
        if left:
            account.update(relieved=False, why=f"{len(left)} of its processes did not end")
        else:
            try:
                self.launch.start_relief(self.candidate_spec)
                account["relieved"] = True
            except (OSError, LaunchError) as exc:
                account.update(relieved=False, why=str(exc)[:300])
        account["relieve_s"] = round(now() - started, 3)
        self.closed.discard("candidate")
        self.reliefs.append({**account, "log_head": dead.stderr.head(RELIEVED_LOG_CHARS),
                             "log_tail": dead.stderr.text(max_bytes=RELIEVED_LOG_CHARS)})
        self._answer_referee(account)

    def _end_candidate(self, grace_s: float) -> tuple[bool, set[int], set[int]]:
        """Let the candidate exit for grace_s, kill its process group and wait for its processes to vanish:
        whether it had exited by itself, the processes it had, and those still there after STOP_WAIT_S."""
        candidate = self.children["candidate"]
        tree = set(processes.descendants(candidate.pid))
        try:
            candidate.popen.wait(timeout=grace_s)
        except Exception:  # subprocess.TimeoutExpired: it did not exit when told to finish
            pass
        by_itself = candidate.popen.poll() is not None
        candidate.kill()
        candidate.popen.wait()
        return by_itself, tree, processes.wait_gone(tree, STOP_WAIT_S)

    def _answer_referee(self, account: dict) -> None:
        """One JSON line on the referee's control pipe."""
        try:
            os.write(self.launch.control, (json.dumps(account) + "\n").encode())
        except OSError:  # the referee is gone; its verdict (or its absence) says the rest
            pass

    def _verdict(self, outcome: str, timeout_s: float) -> tuple[dict, dict, str]:
        referee, candidate = self.children["referee"], self.children["candidate"]
        log_tail = candidate.stderr.text(max_bytes=LOG_TAIL_CHARS)
        details = {"isolation": candidate.isolation, "processes": {n: c.describe_exit() for n, c in self.children.items()},
                   "candidate_output_bytes": candidate.stderr.total + candidate.stdout.total,
                   "processes_start_s": self.start_s,
                   **({"relieved": self.reliefs} if self.reliefs else {})}
        verdict = _last_json(referee.stdout.text())
        reported = _last_json(candidate.stdout.text())
        if outcome == "timeout":
            return {"status": Status.TIMEOUT, "message": f"the evaluation exceeded its {timeout_s:g} s limit and was "
                                                        f"killed"}, details, log_tail
        if outcome.startswith("limit:"):
            return {"status": Status.CRASHED, "message": f"the candidate {outcome.removeprefix('limit:')} and was "
                                                        f"killed"}, details, log_tail
        if outcome.startswith("startup"):
            details["referee_log"] = referee.stderr.text()[-4000:]
            return {"status": Status.INFRA_ERROR, "message": f"judge processes failed to start ({outcome}; "
                    f"processes: {details['processes']})"}, details, log_tail
        if verdict is None:
            if self.ended["candidate"] not in (0, None) and not self.stops:  # it died on its own, not by the judge
                return {"status": Status.CRASHED, "message": f"the candidate process {candidate.describe_exit()}"}, \
                    details, log_tail
            details["referee_log"] = referee.stderr.text()[-4000:]
            message = f"the referee {referee.describe_exit()} without a verdict"
            if b"L" in self.launch.signals["referee"]:
                return {"status": Status.CRASHED, "message": f"{message} while kernel.py was loaded ({CHARGED_NOTE})"}, \
                    details, log_tail
            return {"status": Status.INFRA_ERROR, "message": message}, details, log_tail
        details.update(verdict.pop("details", {}))
        details.setdefault("candidate", reported)
        if (phase := details.pop("candidate_died", None)) and verdict["status"] == Status.CRASHED:
            verdict["message"] = f"the candidate process {candidate.describe_exit()} during {phase}"
        if verdict["status"] == Status.INFRA_ERROR:
            details["referee_log"] = referee.stderr.text()[-4000:]
        return verdict, details, log_tail


def _last_json(text: str) -> dict | None:
    for line in reversed(text.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None
