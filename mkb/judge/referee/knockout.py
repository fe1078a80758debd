"""The knock-out that proves the declared DSL computes the answer, and the repeat that guards it.

After the observed draw (the first graded draw: the candidate's hooks learn which tensor arguments each
genuine DSL callable writes, at what scale and in how long), the referee runs, in an order it draws from
a CSPRNG, the other graded draws, two knocked-out draws on fresh inputs and a repeat of the first draw's
inputs. Every one of them is a solve() command that looks like any other to the candidate's code: the
mode travels only as the command's flag into the harness's solve frame (wire.py, knock.py).

- A knocked-out draw skips every genuine DSL call and overwrites what it wrote: with NaN (bitwise-not
  for integers), or with finite noise at the scale the call's outputs had (so `0 * x`, a NaN check or
  a range check cannot hide the loss). Its answer must come back *incorrect* against the reference
  under the problem's tolerance (or solve() must fail) -- different bits are not enough -- and the draw
  must have made at least one DSL call, for both poisons.
- A candidate process that dies inside a knocked-out draw after at least one DSL call of that draw (a later
  kernel read indices the poison made wild, and the GPU's sticky error aborted the process), whose solve()
  raised there after a DSL call (the same error, raised instead of aborting, leaves the process's CUDA
  context unusable for every call to come), or whose solve() hangs there after a DSL call (a poisoned flag
  or count left it spinning: no answer within WAIT_MIN_S or WAIT_FACTOR times the slowest graded call), gave
  the same signal as a wrong answer: the draw counts as evidence, and the grading goes on in a fresh
  candidate process (referee.relieve; at most one per poison), which must pass every draw still to come, the
  repeat among them, and is the one timed. Dying gives a kernel nothing it could not get by answering
  wrongly when it guesses a knock-out; a death in any other draw, or before the knocked-out draw's first DSL
  call, is a crash as before (a hang there, a timeout).
- The repeat runs the first draw's inputs again, not knocked out: its answer must be correct. An answer
  that changes beyond the tolerance between two identical calls is `incorrect`, and a kernel that
  sabotages repeated inputs to fake a knock-out fails here.
"""

from __future__ import annotations

import secrets
import time

from mkb.judge.candidate import knock, wire
from mkb.judge.referee import checks, draws
from mkb.judge.referee.transport import tree_map
from mkb.judge.referee.verdict import Failure
from mkb.records import Check, Status

POISONS = {"nan": knock.KNOCK_NAN, "noise": knock.KNOCK_NOISE}
"""The knock-out's two overwrites, by the name records use."""
WAIT_MIN_S, WAIT_FACTOR = 10.0, 10.0
"""A knocked-out solve() that has not answered after max(WAIT_MIN_S, WAIT_FACTOR x the slowest graded solve() so
far, the first one's compilation included) hangs: poisoned flags or counts can leave a kernel spinning forever."""


def schedule(graded: int, knocks: bool) -> list[tuple[str, object]]:
    """The draws after the observed one, in an order drawn from a CSPRNG: graded 1..graded-1 and, with
    knocks, the two knock-outs and the repeat."""
    steps: list[tuple[str, object]] = [("draw", d) for d in range(1, graded)]
    if knocks:
        steps += [("knockout", name) for name in POISONS] + [("repeat", 0)]
    secrets.SystemRandom().shuffle(steps)
    return steps


def knocked_out(referee, poison: str, plan: dict) -> dict:
    """One knocked-out draw on fresh inputs; what it showed (the record's details.knockout[poison])."""
    prepared = referee.prepare_draw(graded=False)
    shared = referee.transport.share(prepared.inputs)
    slots = referee.transport.slots(prepared.ref[0])
    channel, wait_s = referee.c, max(WAIT_MIN_S, WAIT_FACTOR * max(referee.details.get("solve_step_s") or [0.0]))
    channel.deadline = time.monotonic() + wait_s
    try:
        reply, index = referee.solve(shared.tree, slots.tree, POISONS[poison], plan)
    except wire.ForgedFrame:
        raise
    except wire.Unanswered as exc:
        return _died(referee, prepared.seed, exc, f"solve() did not answer within {wait_s:.0f} s", (shared, slots))
    except wire.WireError as exc:
        return _died(referee, prepared.seed, exc, f"the candidate process died ({exc})", (shared, slots))
    finally:
        channel.deadline = None
    calls = referee.stream.calls_by_dsl(index).get(str(referee.dsl), 0)
    result = {"seed": prepared.seed, "dsl_calls": calls}
    problem = _failed_outright(reply, prepared.ref[0], referee)
    if problem is not None and not reply.get("ok"):
        _not_in_the_poison(referee, index, problem)
    if problem is not None and not reply.get("ok") and calls >= 1:  # a sticky CUDA error fails every later call
        return _replaced(referee, prepared.seed, calls, problem, "raised", (shared, slots))
    if problem is not None:
        result.update(incorrect=True, how=problem)
    else:
        left = draws.after(referee, shared)
        out = (referee.transport.read(slots, referee.place), draws.updated(referee, left))
        draw = checks.compare_draw(prepared.seed, out, prepared.ref, prepared.anchor, referee.factor,
                                   referee.positions)
        result.update(incorrect=not draw.ok,
                      how=checks.first_failure(draw, 0).removeprefix("draw 1: ") if not draw.ok else "correct")
        _graded_work(referee, reply, out, prepared, left)
    referee.transport.give_back(shared, slots)
    result["evidence"] = bool(result["incorrect"] and calls >= 1)
    return result


def _died(referee, seed: int, exc: wire.WireError, what: str, shared: tuple) -> dict:
    """The candidate process died (exc a WireError) or hung (wire.Unanswered) inside this knocked-out draw: evidence
    when the draw had made a DSL call (the grading goes on in a fresh process); before one, a death is the crash
    it always was (exc goes on to the referee's run()) and a hang a timeout."""
    calls = referee.stream.calls_by_dsl(referee.solves - 1).get(str(referee.dsl), 0)
    hung = isinstance(exc, wire.Unanswered)
    _not_in_the_poison(referee, referee.solves - 1, what)
    if calls < 1 and hung:
        raise Failure(Status.TIMEOUT, f"a knocked-out draw's {what}, before any {referee.dsl} call of the draw")
    if calls < 1:
        raise exc
    return _replaced(referee, seed, calls, what, "hung" if hung else "died", shared)


def _not_in_the_poison(referee, index: int, what: str) -> None:
    """Refuse a knocked-out draw that died, raised or hung inside the judge's own writes (the core announced a call's
    poison and no call evidence followed): the poison failing on memory the candidate chose (a read-only mapping, a
    tensor whose elements share memory) says nothing of whether the DSL computes the answer, and only a knocked-out
    draw writes the candidate's own tensors, so the failure would tell the modes apart."""
    key = referee.stream.poisoning.get(index)
    if key is not None:
        raise Failure(Status.POLICY_VIOLATION, f"a knocked-out draw failed while the judge overwrote what {key} wrote "
                      f"({what[:300]}): the knock-out's poison could not be written to the memory the kernel gave it")


def unchecked_relief(ran: list[tuple[str, bool]]) -> bool:
    """Whether a fresh process took over in a knock-out (kind, replaced) and answered no graded draw or repeat after
    it: the relief of the last shuffled step would be profiled and timed unchecked but for the re-check's three timed
    calls, so the referee grades it once more (details.knockout.relief_check)."""
    pending = False
    for kind, replaced in ran:
        pending = (pending or replaced) if kind == "knockout" else False
    return pending


def _replaced(referee, seed: int, calls: int, what: str, kind: str, shared: tuple) -> dict:
    """The knocked-out draw's evidence after its process died, raised or hung (kind) after `calls` DSL calls: the
    draw's shared inputs and slots go back, and a fresh candidate process takes over (referee.relieve)."""
    referee.transport.give_back(*shared)
    why = f"{what} after {calls} {referee.dsl} call{'s' if calls != 1 else ''}"
    account = referee.relieve(why)
    return {"seed": seed, "dsl_calls": calls, "incorrect": True, "evidence": True, "replaced": kind,
            "how": f"{why}; it {str(account.get('exit'))[:200]}", "relief": referee.relieved}


def _graded_work(referee, reply: dict, out, prepared, left) -> None:
    """What judging a graded draw does after its comparison (the digests, the input guard), done and dropped:
    the time before the next command must not tell the candidate that the draw it just ran was a knock-out."""
    checks.digest(out)
    checks.digest(prepared.ref)
    try:
        draws.guard_inputs(referee, reply, left, prepared.inputs, 0)
    except Failure:  # a knocked-out draw is judged on its answer only
        pass


def _failed_outright(reply: dict, ref, referee) -> str | None:
    """Why a knocked-out solve() gave no comparable answer (raised, wrong structure, unreadable), or None."""
    if not reply.get("ok"):
        return f"solve() failed: {str(reply.get('error'))[:200]}"
    problem = checks.structure_problem(reply.get("outputs", {}), checks.describe(ref, referee.device))
    if problem is not None:
        return f"wrong structure: {problem}"
    return None if reply.get("copied") else "outputs not readable"


def repeat(referee, first, plan: dict) -> dict:
    """The first draw's inputs once more (copied in again from the referee's host copy, in-place inputs as drawn),
    not knocked out: its answer must still be correct. first is draws.First of draw 0."""
    inputs = tree_map(first.inputs, lambda t: t.to(referee.device))
    shared = referee.transport.share(inputs)
    slots = referee.transport.slots(first.out[0])
    reply, index = referee.solve(shared.tree, slots.tree, knock.NORMAL, plan)
    returned = draws.judge_reply(referee, reply, first.ref[0], slots, 0)
    after = draws.after(referee, shared)
    out = (returned, draws.updated(referee, after))
    draw = checks.compare_draw(first.seed, out, first.ref, first.anchor, referee.factor, referee.positions)
    if not draw.ok:
        raise Failure(Status.INCORRECT, "the first draw's inputs, given again: " + checks.first_failure(draw, 0)
                      .removeprefix("draw 1: ") + " (the answer changed between two identical calls beyond the "
                                                  "tolerance)")
    draws.guard_inputs(referee, reply, after, inputs, 0)
    referee.transport.give_back(shared, slots)
    return {"correct": True, "bits_equal": not checks.changed(out, first.out),
            "dsl_calls": referee.stream.calls_by_dsl(index).get(str(referee.dsl), 0)}


def check(results: dict | None) -> str:
    """The knock-out sub-check: passed when both poisons left an incorrect answer after real DSL calls."""
    if not results:
        return Check.NOT_CHECKED
    return Check.PASSED if all(results.get(p, {}).get("evidence") for p in POISONS) else Check.FAILED


def failure_message(dsl: str, results: dict) -> str:
    """Why the knock-out failed, in the agent's terms."""
    for poison in POISONS:
        found = results.get(poison, {})
        if found.get("evidence"):
            continue
        if not found.get("dsl_calls"):
            return (f"a solve() call that was checked made no {dsl} call: every call must run the {dsl} kernel "
                    f"(poison: {poison})")
        return (f"with the {dsl} calls knocked out (their outputs overwritten with {poison}), solve() still "
                f"returned a correct answer: the {dsl} kernel does not compute the answer (it is decorative, "
                f"or its result is multiplied away); a returned tensor must be computed by it")
    return "knock-out failed"
