"""Red team of 2026-12-08 (docs/judge.md, "Red team of DSL use and timing"): the knock-out's own poison must not fail.

A knocked-out draw writes its poison into the candidate's own tensors, and a graded draw into a scratch copy; so a
poison that fails (raises, or faults) on memory the kernel chose fails only in a knocked-out draw, where a failure
after a DSL call counted as the knock-out's evidence (tests/kernels/rt8dsl_knockout_overlap_tirx_p28.py,
..._readonly_...). The core now writes a poison that torch accepts on every layout and dtype it can meet, on exactly
the memory a tensor addresses, announces a poison where the call wrote nothing this time, and the referee refuses a
knocked-out draw that ended inside one.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from mkb.judge.candidate import knock
from mkb.judge.referee import evidence, knockout
from mkb.judge.referee.verdict import Failure
from mkb.records import Status


def _core():
    events: list = []
    core = knock.make_core(events.append, lambda text: events.append({"ev": "finding", "text": text}),
                           lambda: "dispatcher")
    return core, events


def _run(make, write, mode):
    """One observed call, then one call in `mode` with the plan the referee makes from it: (tensor, events)."""
    core, events = _core()
    obj = object()
    core["register"](obj, "tirx", write, "tirx:main:", ["main"])
    stream = evidence.Stream()
    stream.current = 0
    core["draw"](knock.new_state(knock.OBSERVE, {}))
    core["dsl_call"](obj, None, (make(),), {})
    for event in events:
        stream.add(event)
    assert stream.calls[0][0]["written"] == ["0"]
    events.clear()
    t = make()
    core["draw"](knock.new_state(mode, stream.plan(0)))
    core["dsl_call"](obj, None, (t,), {})
    core["draw"](None)
    return t, events


def _first_row(t):  # a kernel's write into the memory an expanded tensor shows: its one row
    t.as_strided((t.shape[-1],), (t.stride(-1),)).copy_((torch.arange(t.shape[-1]) + 3).to(t.dtype))


@pytest.mark.parametrize("mode", [knock.NORMAL, knock.KNOCK_NAN, knock.KNOCK_NOISE])
@pytest.mark.parametrize("make", [
    lambda: torch.zeros(1, 8).expand(4, 8),  # stride 0: torch refuses copy_ into it
    lambda: torch.zeros(1, 8, dtype=torch.int32).expand(4, 8),  # and bitwise_not_
    lambda: torch.zeros(16).as_strided((4, 8), (2, 1)),  # overlapping rows
    lambda: torch.zeros(4, 8).t(),  # an honest transposed layout
    lambda: torch.zeros(1, 8, dtype=torch.uint32).expand(4, 8),  # expanded words torch barely computes on
], ids=["expanded_f32", "expanded_i32", "overlapping", "transposed", "expanded_u32"])
def test_the_poison_is_written_into_any_layout(make, mode):
    t, events = _run(make, _first_row, mode)
    assert [e["ev"] for e in events] == ["call"], events  # memory the call has just written: nothing to announce
    written = t.as_strided((t.shape[-1],), (t.stride(-1),))
    expected = (torch.arange(t.shape[-1]) + 3).to(t.dtype)
    if mode == knock.NORMAL:
        assert torch.equal(written, expected)  # a graded draw's poison went to a scratch copy
    else:
        assert not torch.equal(written, expected)


@pytest.mark.parametrize("mode", [knock.KNOCK_NAN, knock.KNOCK_NOISE])
@pytest.mark.parametrize("dtype", [d for d in (getattr(torch, n, None) for n in ("uint16", "uint32", "uint64",
                                                                                  "float4_e2m1fn_x2")) if d])
def test_the_poison_is_written_into_dtypes_torch_barely_computes_on(dtype, mode):
    """Unsigned words have no bitwise_not_, min or fill_ on the CPU, packed fp4 nothing at all: a constant output
    (noise falls back to bitwise-not) of these made the poison raise in a knocked-out draw only."""
    def write(t):
        t.view(torch.uint8).fill_(7)

    t, events = _run(lambda: torch.zeros(8, dtype=dtype), write, mode)
    assert [e["ev"] for e in events] == ["call"]
    assert not torch.equal(t.view(torch.uint8), torch.full((8 * t.element_size(),), 7, dtype=torch.uint8))


@pytest.mark.parametrize("mode", [knock.NORMAL, knock.KNOCK_NAN, knock.KNOCK_NOISE])
def test_a_poison_where_the_call_wrote_nothing_is_announced_in_every_mode(mode):
    """An argument the observed call wrote and this one did not (the plan's) is where a poison could fault (a read-only
    mapping): the core announces the poison before writing it, whatever the mode."""
    core, events = _core()
    obj, calls = object(), []

    def write_once(t):
        if not calls:
            t.fill_(3.0)
        calls.append(1)

    core["register"](obj, "tirx", write_once, "tirx:main:", ["main"])
    stream = evidence.Stream()
    stream.current = 0
    core["draw"](knock.new_state(knock.OBSERVE, {}))
    core["dsl_call"](obj, None, (torch.zeros(8),), {})
    for event in events:
        stream.add(event)
    events.clear()
    t = torch.full((8,), 5.0)
    core["draw"](knock.new_state(mode, stream.plan(0)))
    core["dsl_call"](obj, None, (t,), {})
    core["draw"](None)
    assert [e["ev"] for e in events] == ["poison", "call"]
    assert torch.equal(t, torch.full((8,), 5.0)) == (mode == knock.NORMAL)


def test_a_draw_that_ends_inside_the_poison_is_no_evidence():
    stream = evidence.Stream()
    stream.current = 3
    stream.add({"ev": "call", "dsl": "tirx", "key": "tirx:a"})
    stream.add({"ev": "poison", "dsl": "tirx", "key": "tirx:b"})
    stream.add({"ev": "call", "dsl": "tirx", "key": "tirx:b"})
    assert stream.poisoning == {}  # the call's evidence followed its poison
    knockout._not_in_the_poison(SimpleNamespace(stream=stream), 3, "the candidate process died")
    stream.add({"ev": "poison", "dsl": "tirx", "key": "tirx:b"})  # then the process died, raised or hung
    with pytest.raises(Failure) as caught:
        knockout._not_in_the_poison(SimpleNamespace(stream=stream), 3, "the candidate process died")
    assert caught.value.status == Status.POLICY_VIOLATION
    assert "while the judge overwrote what tirx:b wrote" in str(caught.value)



@pytest.mark.parametrize("mode", [knock.KNOCK_NAN, knock.KNOCK_NOISE])
def test_the_poison_writes_no_memory_the_call_could_not_address(mode):
    """An overlapping view whose rows skip over other data (strides (2, 2): every even element, each row overlapping
    the next) must be poisoned where it points only: a poison of all the memory it spans would also break the odd
    elements, where a decorative kernel kept eager torch's answer, in knocked-out draws only."""
    buffer = torch.zeros(16)

    def make():
        buffer.zero_()
        buffer[1::2] = 42.0  # the answer, between the view's elements
        return buffer.as_strided((4, 4), (2, 2))

    def write(t):
        buffer[0::2] = 7.0  # the call writes the memory its view addresses

    _run(make, write, mode)
    assert torch.equal(buffer[1::2], torch.full((8,), 42.0))
    assert not torch.equal(buffer[0:14:2], torch.full((7,), 7.0))
