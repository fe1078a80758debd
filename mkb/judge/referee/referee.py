"""The trusted referee process: inputs, reference, fp64 anchor, comparisons, policy and clocks.

Started by the judge (launch.py) inside the grading's namespace, with the host's view of the
files; the harness processes it drives run in sandboxes of their own. It imports the problem,
never the candidate: it draws inputs from fresh CSPRNG seeds, shares them with the candidate
process (memory-mapped files on CPU, CUDA IPC on a GPU), has it run solve() and copy its outputs
into slots the referee owns, and judges those bytes. On a GPU it also times the candidate and the
eager reference (speed.py). It prints exactly one JSON line: the verdict. Who is charged for a
failure is decided in verdict.py.
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

from mkb import inplace  # noqa: E402
from mkb import tensortree as tt  # noqa: E402
from mkb.judge.candidate import knock, wire  # noqa: E402
from mkb.judge.referee import (draws, evidence, knockout, memory, policy, preflight, profiled, share, speed,  # noqa: E402
                               stop, timing)
from mkb.judge.referee.transport import Transport, keep_on_device, private_bytes, tree_map  # noqa: E402
from mkb.judge.referee.verdict import Failure, JudgeFault, charged, finite  # noqa: E402
from mkb.records import Check, Dsl, Status  # noqa: E402

N_DRAWS = 5
OUTRANKED = (Status.IMPORT_ERROR, Status.RUNTIME_ERROR, Status.INCORRECT, Status.WRONG_STRUCTURE, Status.CRASHED)
"""Failures that a finding in the evidence stream (a refused or forbidden action) turns into policy_violation."""


def _add_seconds(spent: dict, name: str, seconds: float) -> None:
    """Add to a {name: seconds} tally (phases_s, correctness_s), rounded to milliseconds."""
    spent[name] = round(spent.get(name, 0.0) + seconds, 3)


class Referee:
    """One grading, driven over the channels to the candidate (and, on a GPU, eager) processes."""

    def __init__(self, spec: dict):
        from mkb.problems import load_module, mutated_positions
        from mkb.records import ProblemInfo

        self.spec, self.device, self.dsl = spec, spec["device"], Dsl(spec["dsl"])
        info = ProblemInfo.model_validate(spec["problem"])
        self.problem = load_module(info)
        self.positions = mutated_positions(info, self.problem.reference)
        """(position, name) of the inputs the problem updates in place (MUTATES); graded after each call."""
        self.factor = float(spec["problem"].get("tolerance_factor", 3.0))
        self.stream = evidence.Stream()
        """What the candidate process reports as it happens (wire.EVIDENCE messages on its channel)."""
        self.c = wire.Channel(spec["c_reply_r"], spec["c_cmd_w"], sink=self.stream.add)
        self.key = secrets.token_bytes(wire.MASK_KEY_BYTES)
        """Masks each solve command's mode (wire.mask); the harness receives it before kernel.py is imported."""
        self.solves = 0
        """solve commands sent so far: the index the stream files each draw's DSL calls under."""
        self.e = wire.Channel(spec["e_reply_r"], spec["e_cmd_w"]) if "e_cmd_w" in spec else None
        """The eager harness (GPU timing only)."""
        self.kernel_loaded = False
        """Set when kernel.py starts to import: from then on a failure is charged (verdict.charged)."""
        self.transport = Transport(self.device, spec["workdir"])
        self.details, self.draws = {"seeds": [], "phases_s": {}}, []
        self.place = "cpu"
        """Where draws are judged: their private copies, the comparison, the digests and the input guard."""
        self.like: Any = None
        """The reference output's structure (shapes and dtypes, on the meta device): the timing slots' model."""
        self.budget: memory.Budget | None = None
        """The GPU memory plan, fixed before kernel.py is imported (memory.py); None on CPU."""
        self.pool_sets = 1
        """Input sets of the timing pool, chosen with the budget."""
        self.candidate_ended = False
        """Set once the judge's parent confirmed that no process of the candidate is left."""
        self.relieved = 0
        """Fresh candidate processes started so far (relieve): the next one's pipes are r<relieved>_*."""
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
        if self.budget is not None:
            memory.sample(self.details["memory"], name)

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
        """A fresh draw, in the referee's private memory (the candidate gets copies: Transport.share)."""
        torch.manual_seed(seed)
        return self.problem.make_inputs(device=self.device, scale=self.spec["scale"])

    def reference(self, inputs: list) -> tuple[Any, Any]:
        """The reference answer and the fp64 anchor's, private to this process, on self.place.

        An answer is (returned, in-place outputs) (mkb.inplace): the reference runs on its own copies of
        the MUTATES inputs, so the shared inputs reach the candidate as drawn.

        On a GPU the draw is judged there when its private copies are small (keep_on_device): comparing
        p28's two 14509x4096 outputs in float64 on the host took 3.7 s per draw, most of a grading, and
        host copies of inputs and outputs for the input guard and the digests cost seconds more. Large
        ones move to the host, leaving the candidate the GPU memory it had before. Another process
        cannot reach this one's private device memory: the candidate only gets IPC handles of tensors
        from the SharedPool.
        """
        with tt.strict_precision():
            ref = inplace.run(self.problem.reference, inputs, self.positions)
            anchor = inplace.run(self.problem.reference, tt.to_anchor(inputs), self.positions, copy=False)
        if self.device == "cuda":
            device_bytes = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
            self.place = "cuda" if keep_on_device(private_bytes(inputs, ref, anchor), device_bytes) else "cpu"
        if self.place == "cuda":
            return tree_map(ref, lambda t: t.detach().clone()), tree_map(anchor, lambda t: t.detach())
        return tree_map(ref, lambda t: t.detach().cpu()), tree_map(anchor, lambda t: t.detach().cpu())

    def ask(self, message: dict) -> dict:
        self.c.send(message)
        return self.c.recv()

    def solve(self, tree: dict, slot_tree: dict, flag: int, plan: dict) -> tuple[dict, int]:
        """One solve command (flag: its mode, knock.py); the reply and the index its evidence is filed under."""
        index, self.solves = self.solves, self.solves + 1
        self.stream.current = index
        try:
            nonce = secrets.token_hex(16)  # the mode travels masked (wire.mask): the pipe is the candidate's to read
            self.c.send({"cmd": "solve", "inputs": tree, "slots": slot_tree, "plan": plan, "nonce": nonce},
                        flag ^ wire.mask(self.key, nonce))
            return self.c.recv(), index
        finally:
            self.stream.current = None

    def run(self) -> dict:
        try:
            return self._run()
        except JudgeFault as f:
            return self.verdict(f.status, f.message, proven=True, **f.details)
        except Failure as f:
            return self.verdict(f.status, f.message, **f.details)
        except wire.ForgedFrame as exc:
            return self.verdict(Status.POLICY_VIOLATION, f"during {self.phase}: {exc}")
        except wire.WireError as exc:
            died_in = self.phase
            return self.verdict(Status.CRASHED, f"the candidate process died during {died_in} ({exc})",
                                candidate_died=died_in)
        except timing.TimingError as exc:
            status = {"incorrect": Status.INCORRECT, "crashed": Status.CRASHED, "infra_error": Status.INFRA_ERROR,
                      "policy_violation": Status.POLICY_VIOLATION}.get(exc.kind, Status.RUNTIME_ERROR)
            return self.verdict(status, f"during timing: {exc}")
        except torch.OutOfMemoryError as exc:  # the referee's own allocation: a candidate's comes as a reply
            return self.out_of_memory(exc)
        except Exception as exc:  # a referee bug, or a candidate that found one: see verdict.charged
            return self.verdict(Status.INFRA_ERROR, f"referee failed: {type(exc).__name__}: {exc}",
                                traceback=traceback.format_exc()[-4000:])

    def _run(self) -> dict:
        harnesses = [("candidate", self.c)] + ([("eager", self.e)] if self.e is not None else [])
        kept: list = []
        signals = {}
        for name, channel in harnesses:
            signals[name] = self.greet(name, channel, kept, record=True)
        for name, channel in harnesses:
            preflight.check(channel, name, self.device, signals[name])  # a failure here is infra_error
        self.phase = "first draw"  # before kernel.py is imported: the judge's memory need, measured alone
        before = memory.read() if self.device == "cuda" else None
        if before is not None:
            torch.cuda.reset_peak_memory_stats()
        upcoming = [self.prepare_draw()]
        self.declare_memory(upcoming[0], before)
        self.phase = "import"
        self.mark_kernel_loading()
        self.load()
        self.correctness(upcoming.pop())  # held by nothing else: its private inputs go when the draw is judged
        evidence = policy.Evidence(dsl=self.dsl, device=self.device, draw_calls=self.details["dsl_calls"],
                                   knockout=self.details.get("knockout"), policy=self.spec.get("dsl_policy", "paper"),
                                   share_min=self.share_min())
        if self.device != "cuda" and self.dsl_applicable():
            self.profile_cpu(evidence)
        self.phase = "policy"
        evidence.report = self.report()
        self.enforce(policy.judge(evidence), final=self.device != "cuda" or self.spec["timing"] == "none")
        timings = {}
        if self.device == "cuda" and self.spec["timing"] != "none":
            timings = self.time(evidence)  # it ends the candidate's processes before the eager reference is timed
        else:
            self.details["candidate_stop"] = self.stop_candidate()
        return self.verdict(Status.PASSED, "passed", **timings)

    def greet(self, name: str, channel: wire.Channel, kept: list, record: bool = False) -> wire.Signal | None:
        """Read a harness's hello (sent before kernel.py is imported: its own facts; with record, its start-up
        seconds go to details), require CUDA in it on a GPU, and send it the preflight (preflight.send: what it
        returns, for preflight.check)."""
        hello = channel.recv()
        if record:
            self.details[f"{name}_startup_s"] = hello.get("startup_s")
        if self.device == "cuda" and not hello.get("cuda"):
            raise Failure(Status.INFRA_ERROR, f"CUDA is not available inside the {name} process's sandbox")
        return preflight.send(channel, self.transport, self.device, kept)

    def load(self) -> None:
        """Have the candidate process import kernel.py, the key sent with the command; every frame it writes from
        then on must carry the key's tag (wire.tag)."""
        self.c.send({"cmd": "load", "key": self.key.hex()})
        self.c.authenticate(self.key)  # the harness tags every frame after this one (wire.tag)
        self.kernel_loaded = True
        loaded = self.c.recv()
        if not loaded.get("ok"):
            raise Failure(Status.IMPORT_ERROR, f"importing kernel.py failed: {loaded.get('error')}",
                          traceback=loaded.get("traceback", ""))

    def relieve(self, why: str) -> dict:
        """Go on with a fresh candidate process after this one died, or failed, inside a knocked-out draw
        (knockout.py): the judge's parent ends what is left of it and starts a relief (stop.relieve), which passes
        its preflight and imports kernel.py with a new key; the stream takes the relief's fingerprint as its new
        baseline. Returns the parent's account of the dead process (exit: how it ended).

        Raises:
            Failure: crashed, when no relief could be started (every one used, or the parent could not).
        """
        phase = self.phase
        self.phase = "relief"
        account = stop.relieve(self.spec["ready_fd"], self.spec["control_fd"])
        if not account.get("relieved"):
            raise Failure(Status.CRASHED, f"the candidate process had to be replaced during {phase} ({why}; it "
                                          f"{str(account.get('exit') or 'ended')[:200]}) and no fresh one could be "
                                          f"started: {str(account.get('why'))[:300]}")
        for fd in (self.c.read_fd, self.c.write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        slot = self.relieved
        self.relieved += 1
        self.c = wire.Channel(self.spec[f"r{slot}_reply_r"], self.spec[f"r{slot}_cmd_w"], sink=self.stream.add)
        self.key = secrets.token_bytes(wire.MASK_KEY_BYTES)
        self.stream.new_process()
        kept: list = []
        preflight.check(self.c, "fresh candidate", self.device, self.greet("fresh candidate", self.c, kept))
        self.load()
        self.phase = phase
        return account

    def dsl_applicable(self) -> bool:
        return self.device == "cuda" or self.dsl == Dsl.TIRX

    def profile_cpu(self, evidence: policy.Evidence) -> None:
        """On CPU: three profiled calls, each on a fresh draw and judged like one (profiled.py), for the DSL's share
        of CPU time (share.py)."""
        self.phase = "profile"
        replies = []
        for k in range(timing.PROFILED):
            draw = self.prepare_draw(graded=False)
            shared, slots = self.transport.share(draw.inputs), self.transport.slots(draw.ref[0])
            reply = self.ask({"cmd": "profile", "inputs": shared.tree, "slots": slots.tree, "calls": 1,
                              "restore": [i for i, _ in self.positions]})
            replies.append(reply)
            if reply.get("ok"):
                label = f"profiled call {k + 1}"
                out = profiled.answer(self, reply, draw.ref[0], slots, shared, label, self.place)
                profiled.judge(self, label, draw.seed, out, draw.ref, draw.anchor)
            self.transport.give_back(shared, slots)
        reply = profiled.merge(replies)
        evidence.share = share.measure(reply, self.stream.built, str(self.dsl))
        self.details["dsl_share"] = evidence.share.get("share")
        self.details["dsl_share_detail"] = evidence.share

    def share_min(self) -> tuple[float, str]:
        """The strict policy's floor on the DSL share: the problem's DSL_SHARE, else policy.STRICT_SHARE."""
        problem = self.spec["problem"]
        if problem.get("dsl_share_min") is not None:
            return float(problem["dsl_share_min"]), str(problem.get("dsl_share_reason") or "")
        return policy.STRICT_SHARE, ""

    def prepare_draw(self, graded: bool = True) -> draws.Prepared:
        """A draw from a fresh seed, its reference and anchor; then the GPU is handed over (memory.release)."""
        seed = secrets.randbits(63)
        if graded:
            self.details["seeds"].append(seed)
        with self.step("inputs"):
            inputs = self.inputs(seed)
        with self.step("reference"):
            ref, anchor = self.reference(inputs)
        memory.release(self.device)  # the anchor's float64 transients: the candidate's call comes next
        return draws.Prepared(seed, inputs, ref, anchor)

    def declare_memory(self, first: draws.Prepared, before: memory.Reading | None) -> None:
        """The judge's memory claim, measured on the first draw before kernel.py is imported (details.memory)."""
        self.budget, self.pool_sets, self.details["memory"] = memory.declare(first.inputs, first.ref, first.anchor,
                                                                             self.place, before)

    def out_of_memory(self, exc: torch.OutOfMemoryError) -> dict:
        """The verdict when the referee's own allocation failed: blamed on whoever held more than allowed."""
        status, message, details = memory.outcome(self.budget, exc, not self.candidate_ended, self.phase)
        self.details.setdefault("memory", {}).update(details)
        return self.verdict(status, message, proven=status == Status.INFRA_ERROR and self.budget is not None)

    def correctness(self, upcoming: draws.Prepared) -> None:
        """Five graded draws on fresh inputs (the first already made, and observed), and where the DSL can run
        the knock-outs and the repeat, interleaved at random (knockout.py); stops at the first error, but after
        a wrong answer runs the remaining graded draws (no knock-out, no repeat) so that the report can say how
        many of the five were correct (as the original)."""
        self.phase = "correctness"
        self.details["dsl_calls"] = []
        digests: tuple[list, list] = ([], [])
        knocks = self.dsl_applicable()
        first, wrong = draws.graded(self, 0, upcoming, knock.OBSERVE if knocks else knock.NORMAL, {}, digests)
        del upcoming
        plan = self.stream.plan(0) if knocks else {}
        results: dict = {}
        graded = 1
        ran: list[tuple[str, bool]] = []
        for kind, which in knockout.schedule(N_DRAWS, knocks):
            if wrong is not None and kind != "draw":
                continue
            if kind == "draw":  # graded draws are numbered in the order they ran
                which, graded = graded, graded + 1
            results.setdefault("order", []).append(f"{kind} {which}")
            if kind == "draw":
                miss = draws.graded(self, which, self.prepare_draw(), knock.NORMAL, plan, digests)[1]
                wrong = wrong or miss
            elif kind == "knockout":
                self.phase = "knock-out"
                results[which] = knockout.knocked_out(self, which, plan)
                self.phase = "correctness"
            else:
                results["repeat"] = knockout.repeat(self, first, plan)
                self.details["dsl_calls"].append(self.stream.calls_by_dsl(self.solves - 1))
            ran.append((kind, kind == "knockout" and bool(results[which].get("replaced"))))
        if knockout.unchecked_relief(ran) and wrong is None:  # graded once before it is profiled and timed
            results.setdefault("order", []).append(f"relief check (draw {graded})")
            wrong = draws.graded(self, graded, self.prepare_draw(), knock.NORMAL, plan, digests)[1]
            check = self.draws.pop()  # not one of the five draws the record counts, as the original's
            results["relief_check"] = {"seed": check.seed, "ok": check.ok}
        if wrong is not None:
            raise Failure(Status.INCORRECT, wrong)
        if knocks:
            results["plan"] = {k: v["args"] for k, v in list(plan.items())[:20]}
            self.details["knockout"] = results

    def report(self) -> dict:
        """Ask the harness for its last report (it streams its findings and fingerprint first); the stream's summary."""
        reply = self.ask({"cmd": "report"})
        summary = self.stream.summary()
        summary["forbidden_modules"] = reply.get("forbidden_modules") if isinstance(reply.get("forbidden_modules"),
                                                                                  list) else []
        if isinstance(reply.get("gpu_peak_bytes"), int) and "memory" in self.details:  # its word: information only
            self.details["memory"]["kernel_reported_peak_bytes"] = reply["gpu_peak_bytes"]
        self.details["candidate"] = summary
        return summary

    def enforce(self, verdict: policy.Verdict, final: bool) -> None:
        self.details["dsl_checks"] = verdict.checks
        self.details["dsl_policy"] = verdict.policy
        self.details["launched_kernels"] = [k.model_dump() for k in verdict.kernels]
        self.dsl_check = verdict.dsl_check
        if verdict.violations:
            raise Failure(Status.POLICY_VIOLATION, "; ".join(verdict.violations))
        failed = {k for k, v in verdict.checks.items() if v == Check.FAILED}
        if failed - ({"trace", "share"} if not final else set()):
            raise Failure(Status.POLICY_VIOLATION, verdict.message)

    def stop_candidate(self) -> dict:
        """End the candidate's processes, confirmed by the judge's parent (stop.py); the parent's account."""
        account = stop.end_candidate(self.c, self.spec["ready_fd"], self.spec["control_fd"])
        self.candidate_ended = account.get("left") == 0
        return account

    def mark_kernel_loading(self) -> None:
        """Tell the judge's parent that the candidate's code may run from now on (on the ready pipe it
        still holds): if this process dies without a verdict after this, the candidate is charged."""
        try:
            os.write(self.spec["ready_fd"], b"L")
        except OSError:  # the parent is gone; the verdict goes nowhere anyway
            pass

    def time(self, evidence: policy.Evidence) -> dict:
        result = speed.measure(self, evidence)  # it names its own phases, "timing: eager" first
        self.details["dsl_share"] = (evidence.share or {}).get("share")
        self.details["dsl_share_detail"] = evidence.share
        self.enforce(policy.judge(evidence), final=True)
        return result

    def verdict(self, status: Status, message: str, proven: bool = False, **extra) -> dict:
        self.phase = "verdict"
        memory.finish(self.budget, self.details.get("memory", {}))
        status, message = charged(status, message, self.kernel_loaded, proven)
        if status in OUTRANKED and (self.stream.findings or self.stream.patched):
            # what the kernel did that is forbidden explains the failure better than how it then failed
            found = self.stream.findings + [f"replaced {name}" for name in self.stream.patched[:3]]
            status, message = Status.POLICY_VIOLATION, "; ".join(found) + f" (then: {message})"
            self.details["candidate"] = self.stream.summary()
        details = dict(self.details)
        details.update({k: v for k, v in extra.items() if k not in ("kernel_ms", "eager_ms", "speedup")})
        record = {"status": str(status), "message": message, "draws": [d.model_dump() for d in self.draws],
                  "dsl_check": str(getattr(self, "dsl_check", Check.NOT_CHECKED)), "details": details}
        if status == Status.PASSED:
            record.update({k: extra[k] for k in ("kernel_ms", "eager_ms", "speedup") if k in extra})
        return record


def main() -> int:
    spec = wire.await_spec(sys.argv)
    if spec is None:  # a spare the judge did not need
        return 0
    os.write(spec["ready_fd"], b"ready")
    try:
        verdict = Referee(spec).run()
    except Exception as exc:  # before the kernel is loaded (a broken problem, say): the judge's trouble
        verdict = {"status": str(Status.INFRA_ERROR), "message": f"referee failed: {type(exc).__name__}: {exc}",
                   "details": {"traceback": traceback.format_exc()[-4000:]}}
    os.write(_REAL_STDOUT, (json.dumps(finite(verdict), allow_nan=False, default=str) + "\n").encode())
    try:
        wire.Channel(spec["c_reply_r"], spec["c_cmd_w"]).send({"cmd": "finish"})
    except wire.WireError:
        pass
    return 0


if __name__ == "__main__":
    wire.leave(main())
