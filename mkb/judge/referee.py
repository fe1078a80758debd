"""The trusted referee process: inputs, reference, fp64 anchor, comparisons, policy and clocks.

Run by the judge as `python -m mkb.judge.referee SPEC.json`. It imports the problem, never the
candidate: it draws inputs from fresh CSPRNG seeds, shares them with the candidate process
(memory-mapped files on CPU, CUDA IPC on a GPU), has it run solve() and copy its outputs into
slots the referee owns, and judges those bytes. On a GPU it also times the candidate and the
eager reference (timing.py). It prints exactly one JSON line: the verdict.
"""

from __future__ import annotations

import os
import sys

_REAL_STDOUT = os.dup(1)
os.dup2(2, 1)

import contextlib  # noqa: E402
import json  # noqa: E402
import secrets  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

from mkb import tensortree as tt  # noqa: E402
from mkb.judge import checks, policy, timing, wire  # noqa: E402
from mkb.records import Check, Dsl, Status  # noqa: E402

N_DRAWS = 5


class Failure(Exception):
    """Grading stops here with this status and message."""

    def __init__(self, status: Status, message: str, **details):
        super().__init__(message)
        self.status, self.message, self.details = status, message, details


class SharedPool:
    """The GPU memory the candidate may map: inputs and output slots, allocated from a pool of their own.

    A CUDA IPC handle maps the whole allocation its tensor was carved from, and torch's caching
    allocator carves many tensors from one allocation: a reference or a pristine copy next to an
    input in the same segment would be readable and writable by the candidate's kernels. Everything
    shared is therefore allocated here, and nothing else is.
    """

    def __init__(self, device: str):
        self.pool = torch.cuda.MemPool() if device == "cuda" else None

    @contextlib.contextmanager
    def allocating(self):
        if self.pool is None:
            yield
            return
        with torch.cuda.use_mem_pool(self.pool):
            yield


class Transport:
    """Tensors the referee owns and shares: mapped files on CPU, CUDA IPC on a GPU."""

    def __init__(self, device: str, workdir: str):
        self.device, self.workdir, self.kept = device, workdir, []
        self.shared = SharedPool(device)

    def share(self, obj: Any, tag: str) -> dict:
        if self.device == "cpu":
            return wire.encode(obj, wire.file_share(self.workdir, tag))
        self.kept.append(obj)
        return wire.encode(obj, wire.ipc_share)

    def slots(self, like: Any, tag: str) -> tuple[dict, Any]:
        if self.device == "cpu":
            tree = wire.encode(like, wire.file_slot(self.workdir, tag))
            return tree, None
        with self.shared.allocating():
            empty = _map(like, lambda t: torch.zeros(t.shape, dtype=t.dtype, device="cuda"))
        self.kept.append(empty)
        return wire.encode(empty, wire.ipc_share), empty

    def read(self, tree: dict, tensors: Any, place: str = "cpu") -> Any:
        """A private copy of what shared tensors hold now, on `place` (outside the SharedPool)."""
        if tensors is None:
            return wire.decode(tree, wire.read_file_leaf)
        return _map(tensors, lambda t: t.detach().to(place, copy=True))


KEEP_ON_DEVICE_FRACTION = 0.1
"""A draw is judged on the GPU while the referee's private copies (reference, anchor, pristine inputs,
read outputs) take at most this fraction of its memory (14 GB on an H200); the problems' own peaks are
at most 28 GB there, their fp64 anchors up to 56 GB (p06)."""


def keep_on_device(nbytes: int, device_bytes: int) -> bool:
    """Whether a draw's private copies (nbytes together) stay on the GPU, where it is then judged."""
    return nbytes <= KEEP_ON_DEVICE_FRACTION * device_bytes


def private_bytes(inputs: Any, ref: Any, anchor: Any) -> int:
    """What judging one draw keeps besides the shared tensors: reference, anchor, read outputs, pristine inputs."""
    return 2 * tt.nbytes(ref) + tt.nbytes(anchor) + tt.nbytes(inputs)


def _add_seconds(spent: dict, name: str, seconds: float) -> None:
    """Add to a {name: seconds} tally (phases_s, correctness_s), rounded to milliseconds."""
    spent[name] = round(spent.get(name, 0.0) + seconds, 3)


def _map(obj: Any, fn) -> Any:
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map(o, fn) for o in obj)
    return fn(obj) if isinstance(obj, torch.Tensor) else obj


class Referee:
    """One grading, driven over the channels to the candidate (and, on a GPU, eager) processes."""

    def __init__(self, spec: dict):
        from mkb.problems import load_module
        from mkb.records import ProblemInfo

        self.spec, self.device, self.dsl = spec, spec["device"], Dsl(spec["dsl"])
        self.problem = load_module(ProblemInfo.model_validate(spec["problem"]))
        self.factor = float(spec["problem"].get("tolerance_factor", 3.0))
        self.c = wire.Channel(spec["c_reply_r"], spec["c_cmd_w"])
        self.transport = Transport(self.device, spec["workdir"])
        self.details, self.draws = {"seeds": [], "phases_s": {}}, []
        self.place = "cpu"
        """Where draws are judged: their private copies, the comparison, the digests and the input guard."""
        self.like: Any = None
        """The reference output's structure (shapes and dtypes, on the meta device): the timing slots' model."""
        self._phase, self._since = "startup", time.monotonic()

    @property
    def phase(self) -> str:
        """What the grading is doing now; entering a phase records the seconds the last one took."""
        return self._phase

    @phase.setter
    def phase(self, name: str) -> None:
        now = time.monotonic()
        _add_seconds(self.details["phases_s"], self._phase, now - self._since)
        self._phase, self._since = name, now

    @contextlib.contextmanager
    def step(self, name: str, each: str | None = None):
        """Seconds spent in one step of the correctness draws, summed over draws (details.correctness_s);
        with `each`, also every draw's own seconds in details[each]."""
        started = time.monotonic()
        try:
            yield
        finally:
            spent = time.monotonic() - started
            _add_seconds(self.details.setdefault("correctness_s", {}), name, spent)
            if each is not None:
                self.details.setdefault(each, []).append(round(spent, 3))

    def inputs(self, seed: int) -> list:
        """A fresh draw, in the memory the candidate may map (SharedPool)."""
        torch.manual_seed(seed)
        with self.transport.shared.allocating():
            return self.problem.make_inputs(device=self.device, scale=self.spec["scale"])

    def reference(self, inputs: list) -> tuple[Any, Any]:
        """The reference output and the fp64 anchor, private to this process, on self.place.

        On a GPU the draw is judged there when its private copies are small (keep_on_device): comparing
        p28's two 14509x4096 outputs in float64 on the host took 3.7 s per draw, most of a grading, and
        host copies of inputs and outputs for the input guard and the digests cost seconds more. Large
        ones move to the host, leaving the candidate the GPU memory it had before. Another process
        cannot reach this one's private device memory: the candidate only gets IPC handles of tensors
        from the SharedPool.
        """
        with tt.strict_precision():
            ref = self.problem.reference(*inputs)
            anchor = self.problem.reference(*tt.to_anchor(inputs))
        if self.device == "cuda":
            device_bytes = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
            self.place = "cuda" if keep_on_device(private_bytes(inputs, ref, anchor), device_bytes) else "cpu"
        if self.place == "cuda":
            return _map(ref, lambda t: t.detach().clone()), _map(anchor, lambda t: t.detach())
        return _map(ref, lambda t: t.detach().cpu()), _map(anchor, lambda t: t.detach().cpu())

    def ask(self, message: dict) -> dict:
        self.c.send(message)
        return self.c.recv()

    def run(self) -> dict:
        try:
            return self._run()
        except Failure as f:
            return self.verdict(f.status, f.message, **f.details)
        except wire.WireError as exc:
            died_in = self.phase
            return self.verdict(Status.CRASHED, f"the candidate process died during {died_in} ({exc})",
                                candidate_died=died_in)
        except timing.TimingError as exc:
            status = {"incorrect": Status.INCORRECT, "crashed": Status.CRASHED,
                      "infra_error": Status.INFRA_ERROR}.get(exc.kind, Status.RUNTIME_ERROR)
            return self.verdict(status, f"during timing: {exc}")

    def _run(self) -> dict:
        hello = self.c.recv()  # sent before kernel.py is imported: its facts are the harness's own
        self.details["candidate_startup_s"] = hello.get("startup_s")
        if self.device == "cuda" and not hello.get("cuda"):
            raise Failure(Status.INFRA_ERROR, "CUDA is not available inside the candidate's sandbox")
        self.phase = "import"
        self.c.send({"cmd": "load"})
        upcoming = self.prepare_draw()  # the first draw is made while the candidate imports and compiles
        loaded = self.c.recv()
        if not loaded.get("ok"):
            raise Failure(Status.IMPORT_ERROR, f"importing kernel.py failed: {loaded.get('error')}",
                          traceback=loaded.get("traceback", ""))
        first_out, first_tree = self.correctness(upcoming)
        evidence = policy.Evidence(dsl=self.dsl, device=self.device, draw_calls=self.details["dsl_calls"])
        if self.dsl_applicable():
            evidence.knockout_changed = self.knockout(first_out, first_tree)
        self.phase = "policy"
        evidence.report = self.report()
        self.enforce(policy.judge(evidence), final=self.device != "cuda" or self.spec["timing"] == "none")
        timings = {}
        if self.device == "cuda" and self.spec["timing"] != "none":
            timings = self.time(evidence)
        return self.verdict(Status.PASSED, "passed", **timings)

    def dsl_applicable(self) -> bool:
        return self.device == "cuda" or self.dsl == Dsl.TIRX

    def prepare_draw(self) -> tuple:
        """A draw from a fresh seed: (seed, inputs, reference, anchor, pristine copy of the inputs)."""
        seed = secrets.randbits(63)
        self.details["seeds"].append(seed)
        with self.step("inputs"):
            inputs = self.inputs(seed)
        with self.step("reference"):
            ref, anchor = self.reference(inputs)
        with self.step("pristine copy"):
            pristine = _map(inputs, lambda t: t.detach().to(self.place, copy=True))
        return seed, inputs, ref, anchor, pristine

    def correctness(self, upcoming: tuple) -> tuple[Any, dict]:
        """Five draws on fresh inputs (the first one already made); stops at the first error, but runs every draw
        after a wrong answer so that the report can say how many of the five were correct (as the original)."""
        self.phase = "correctness"
        self.details["dsl_calls"] = []
        out_digests, ref_digests, first, wrong = [], [], None, None
        for d in range(N_DRAWS):
            seed, inputs, ref, anchor, pristine = upcoming if d == 0 else self.prepare_draw()
            with self.step("solve", each="solve_step_s"):
                tree = self.transport.share(inputs, f"d{d}")
                slot_tree, slots = self.transport.slots(ref, f"s{d}")
                reply = self.ask({"cmd": "solve", "inputs": tree, "slots": slot_tree,
                                  "mode": "observe" if d == 0 else "normal"})
            with self.step("read outputs"):
                out = self.judge_reply(reply, ref, slot_tree, slots, d)
            self.details["dsl_calls"].append(reply.get("dsl_calls", {}))
            with self.step("compare"):
                draw = checks.compare_draw(seed, out, ref, anchor, self.factor)
            self.draws.append(draw)
            with self.step("digests"):
                out_digests.append(checks.digest(out))
                ref_digests.append(checks.digest(ref))
            if (stale := checks.ignores_inputs(out_digests, ref_digests)) is not None:
                raise Failure(Status.INCORRECT, stale)
            if not draw.ok:
                wrong = wrong or checks.first_failure(draw, d)
                continue
            with self.step("input guard"):
                self.guard_inputs(reply, inputs, tree, pristine, d)
            if d == 0:
                first = (out, tree)
                self.like = _map(ref, lambda t: torch.empty(t.shape, dtype=t.dtype, device="meta"))
        if wrong is not None:
            raise Failure(Status.INCORRECT, wrong)
        return first

    def judge_reply(self, reply: dict, ref: Any, slot_tree: dict, slots: Any, d: int) -> Any:
        if not reply.get("ok") and reply.get("kind") == "infra_error":
            raise Failure(Status.INFRA_ERROR, f"sharing inputs with the candidate failed: {reply.get('error')}",
                          traceback=reply.get("traceback", ""))
        if not reply.get("ok"):
            raise Failure(Status.RUNTIME_ERROR, f"draw {d + 1}: solve() raised {reply.get('error')}",
                          traceback=reply.get("traceback", ""))
        problem = checks.structure_problem(reply["outputs"], checks.describe(ref, self.device))
        if problem is not None:
            raise Failure(Status.WRONG_STRUCTURE, f"draw {d + 1}: {problem}")
        if not reply.get("copied"):
            raise Failure(Status.WRONG_STRUCTURE, f"draw {d + 1}: the outputs could not be read back as plain tensors")
        return self.transport.read(slot_tree, slots, self.place)

    def guard_inputs(self, reply: dict, inputs: Any, tree: dict, pristine: Any, d: int) -> None:
        if self.device != "cuda":
            now = self.transport.read(tree, None)
        else:  # the shared inputs themselves when judging on the GPU, else a host copy of them
            now = inputs if self.place == "cuda" else self.transport.read(tree, inputs)
        changed = [p for (p, a), (_, b) in zip(tt.flatten(now, "in"), tt.flatten(pristine, "in"))
                   if isinstance(a, torch.Tensor) and not tt.bitwise_equal(a, b)]
        changed += [p for p in reply.get("mutated", []) if p not in changed]
        if reply.get("alias"):
            raise Failure(Status.INCORRECT, f"draw {d + 1}: {reply['alias'][0]} shares memory with an input; "
                                            f"return new tensors")
        if changed:
            raise Failure(Status.INCORRECT, f"draw {d + 1}: solve() modified its input {changed[0]} in place; "
                                            f"inputs must be left unchanged")

    def knockout(self, out0: Any, tree: dict) -> bool:
        """Re-run draw 1 with the DSL calls skipped and their outputs poisoned; did the outputs change?"""
        self.phase = "knock-out"
        slot_tree, slots = self.transport.slots(out0, "ko")
        reply = self.ask({"cmd": "solve", "inputs": tree, "slots": slot_tree, "mode": "knockout"})
        self.details["knockout"] = {"ok": reply.get("ok"), "dsl_calls": reply.get("dsl_calls"),
                                    "error": reply.get("error")}
        if not reply.get("ok") or not reply.get("copied"):
            return True  # without the DSL calls solve() failed outright: its result depends on them
        return checks.changed(self.transport.read(slot_tree, slots, self.place), out0)

    def report(self) -> dict:
        reply = self.ask({"cmd": "report"})
        self.details["candidate"] = {k: reply.get(k) for k in ("built", "called", "findings", "patched",
                                                                "forbidden_modules")}
        return reply

    def enforce(self, verdict: policy.Verdict, final: bool) -> None:
        self.details["dsl_checks"] = verdict.checks
        self.details["launched_kernels"] = [k.model_dump() for k in verdict.kernels]
        self.dsl_check = verdict.dsl_check
        if verdict.violations:
            raise Failure(Status.POLICY_VIOLATION, "; ".join(verdict.violations))
        failed = {k for k, v in verdict.checks.items() if v == Check.FAILED}
        if failed - ({"trace"} if not final else set()):
            raise Failure(Status.POLICY_VIOLATION, policy.dsl_failure_message(str(self.dsl), verdict.checks))

    def time(self, evidence: policy.Evidence) -> dict:
        from mkb.judge import speed

        result = speed.measure(self, evidence)  # it names its own phases, "timing: eager" first
        self.enforce(policy.judge(evidence), final=True)
        return result

    def verdict(self, status: Status, message: str, **extra) -> dict:
        self.phase = "verdict"
        details = dict(self.details)
        details.update({k: v for k, v in extra.items() if k not in ("kernel_ms", "eager_ms", "speedup")})
        record = {"status": str(status), "message": message, "draws": [d.model_dump() for d in self.draws],
                  "dsl_check": str(getattr(self, "dsl_check", Check.NOT_CHECKED)), "details": details}
        if status == Status.PASSED:
            record.update({k: extra[k] for k in ("kernel_ms", "eager_ms", "speedup") if k in extra})
        return record


def _finite(obj: Any) -> Any:
    """The verdict with NaN/Inf replaced by None (the line is strict JSON)."""
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return wire.finite(obj) if isinstance(obj, float) else obj


def main() -> int:
    spec = wire.await_spec(sys.argv)
    if spec is None:  # a spare the judge did not need
        return 0
    os.write(spec["ready_fd"], b"ready")
    os.close(spec["ready_fd"])
    try:
        verdict = Referee(spec).run()
    except Exception as exc:  # a bug or broken problem here is infrastructure trouble, never the model's
        verdict = {"status": str(Status.INFRA_ERROR), "message": f"referee failed: {type(exc).__name__}: {exc}",
                   "details": {"traceback": traceback.format_exc()[-4000:]}}
    os.write(_REAL_STDOUT, (json.dumps(_finite(verdict), allow_nan=False, default=str) + "\n").encode())
    try:
        wire.Channel(spec["c_reply_r"], spec["c_cmd_w"]).send({"cmd": "finish"})
    except wire.WireError:
        pass
    return 0


if __name__ == "__main__":
    wire.leave(main())
