"""One draw on the trusted side: made privately, shared as copies, solved, read back, compared and guarded.

The referee draws inputs in its own memory, computes the reference and the fp64 anchor there and hands
the candidate copies (transport.Transport.share); its private inputs are the pristine copy the input
guard compares the shared memory with after the call. Functions over the running referee.Referee
(its transport, channels, details and steps), as knockout.py's are.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from mkb import inplace
from mkb import tensortree as tt
from mkb.judge.referee import checks, memory
from mkb.judge.referee.transport import Shared, tree_map
from mkb.judge.referee.verdict import Failure
from mkb.records import Status


class Prepared(NamedTuple):
    """A draw the referee made: its seed, its private inputs (the pristine copy the input guard compares with; the
    candidate gets copies), and the reference's and the fp64 anchor's answers (mkb.inplace), on Referee.place."""

    seed: int
    inputs: list
    ref: tuple
    anchor: tuple


class First(NamedTuple):
    """What the repeat needs of the first graded draw: its seed, its inputs (on the host), answers and output."""

    seed: int
    inputs: list
    ref: tuple
    anchor: tuple
    out: tuple


def graded(referee, d: int, draw: Prepared, flag: int, plan: dict, digests: tuple[list, list]) -> tuple:
    """Graded draw d: solve, read, compare, guard; raises Failure when it errs. What the repeat needs (First, of
    draw 0) and why the answer was wrong (None when it was right)."""
    with referee.step("solve", each="solve_step_s"):
        shared = referee.transport.share(draw.inputs)
        slots = referee.transport.slots(draw.ref[0])
        reply, index = referee.solve(shared.tree, slots.tree, flag, plan)
    with referee.step("read outputs"):
        returned = judge_reply(referee, reply, draw.ref[0], slots, d)
        left = after(referee, shared)
        out = (returned, updated(referee, left))
    referee.details["dsl_calls"].append(referee.stream.calls_by_dsl(index))
    with referee.step("compare"):
        result = checks.compare_draw(draw.seed, out, draw.ref, draw.anchor, referee.factor, referee.positions)
    referee.draws.append(result)
    with referee.step("digests"):
        digests[0].append(checks.digest(out))
        digests[1].append(checks.digest(draw.ref))
    if (stale := checks.ignores_inputs(*digests)) is not None:
        raise Failure(Status.INCORRECT, stale)
    if not result.ok:
        referee.transport.give_back(shared, slots)
        return None, checks.first_failure(result, d)
    with referee.step("input guard"):
        guard_inputs(referee, reply, left, draw.inputs, d)
    referee.transport.give_back(shared, slots)
    if d != 0:
        return None, None
    referee.like = tree_map(draw.ref[0], lambda t: torch.empty(t.shape, dtype=t.dtype, device="meta"))
    with referee.step("pristine copy"):  # kept on the host: the GPU is the candidate's between draws
        return First(draw.seed, tree_map(draw.inputs, lambda t: t.detach().cpu()), draw.ref, draw.anchor, out), None


def after(referee, shared: Shared) -> Any:
    """The shared inputs as the candidate left them: themselves on a GPU, a host copy of the files on CPU."""
    return shared.tensors if shared.tensors is not None else referee.transport.read(shared)


def updated(referee, inputs: Any) -> tuple:
    """Private copies of the MUTATES inputs of an argument list, on referee.place."""
    return tuple(t.detach().to(referee.place, copy=True) for t in inplace.updated(inputs, referee.positions))


def judge_reply(referee, reply: dict, ref: Any, slots: Shared, d: int) -> Any:
    """The outputs the candidate copied into its slots, on referee.place; Failure when solve() failed or returned
    another structure."""
    if not reply.get("ok") and reply.get("kind") == "infra_error":
        raise Failure(Status.INFRA_ERROR, f"sharing inputs with the candidate failed: {reply.get('error')}",
                      traceback=reply.get("traceback", ""))
    if not reply.get("ok"):
        raise Failure(Status.RUNTIME_ERROR, f"draw {d + 1}: solve() raised {reply.get('error')}"
                      + memory.note(referee.budget, str(reply.get("error"))), traceback=reply.get("traceback", ""))
    problem = checks.structure_problem(reply["outputs"], checks.describe(ref, referee.device))
    if problem is not None:
        raise Failure(Status.WRONG_STRUCTURE, f"draw {d + 1}: {problem}")
    if not reply.get("copied"):
        raise Failure(Status.WRONG_STRUCTURE, f"draw {d + 1}: the outputs could not be read back as plain tensors")
    return referee.transport.read(slots, referee.place)


def guard_inputs(referee, reply: dict, now: Any, pristine: Any, d: int) -> None:
    """Every input the problem does not update in place (MUTATES) is bit for bit as drawn."""
    allowed = {f"in[{i}]" for i, _ in referee.positions}
    changed = [p for (p, a), (_, b) in zip(tt.flatten(now, "in"), tt.flatten(pristine, "in"))
               if isinstance(a, torch.Tensor) and p not in allowed and not tt.bitwise_equal(a, b)]
    changed += [p for p in reply.get("mutated", []) if p not in changed and p not in allowed]
    if reply.get("alias"):
        raise Failure(Status.INCORRECT, f"draw {d + 1}: {reply['alias'][0]} shares memory with an input; "
                                        f"return new tensors")
    if changed:
        only = f"only {', '.join(n for _, n in referee.positions)} may change" if referee.positions else \
            "inputs must be left unchanged"
        raise Failure(Status.INCORRECT, f"draw {d + 1}: solve() modified its input {changed[0]} in place; {only}")
