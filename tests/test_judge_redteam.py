"""Red team of 2026-12-07 (docs/judge.md, "Red team on CPU (2026-12-07)"): what a record carries out of a grading.

The knock-out's side channels are graded end to end by tests/test_judge.py (tests/kernels/knockout_version_counter.py
and the others); here, the record of a kernel whose text is hostile must store, show and send like any other.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from mkb.agent.feedback import report
from mkb.judge import grade, sandbox
from mkb.judge.credentials import redact_record
from mkb.judge.scrub import MESSAGE_CHARS, REPLACEMENT, TEXT_CHARS, scrub, text
from mkb.problems import catalog_for, resolve
from mkb.records import JudgeRecord, Status
from mkb.store import Store

ROOT = Path(__file__).resolve().parent.parent
KERNELS = Path(__file__).resolve().parent / "kernels"
UNSAFE = "\ud800\x00\x1b\x07\x7f\x9b\u202e\u2066\r"
needs_sandbox = pytest.mark.skipif(sandbox.find()[0] is None, reason=f"no judge sandbox here: {sandbox.find()[1]}")


def test_scrub_replaces_what_cannot_be_stored_or_shown_and_keeps_the_rest():
    assert text("ok\tline\n" + UNSAFE + "é✓") == "ok\tline\n" + REPLACEMENT * len(UNSAFE) + "é✓"
    assert scrub({"k\x1b": [1.5, math.inf, -math.nan, "\ud800", 3, None, True]}) == \
        {"k" + REPLACEMENT: [1.5, None, None, REPLACEMENT, 3, None, True]}


def test_every_record_is_scrubbed_with_or_without_secrets():
    record = JudgeRecord(status=Status.RUNTIME_ERROR, message="boom" + UNSAFE, problem="p28", dsl="cutedsl",
                         device="cpu", log_tail="tail\x1b[2J", details={"traceback": "tb\ud800", "x": math.inf})
    for environ in ({}, {"OPENAI_API_KEY": "sk-0123456789abcdef"}):
        clean = redact_record(record, environ)
        dumped = json.dumps(clean.model_dump(mode="json"), allow_nan=False)
        assert not any(c in dumped for c in UNSAFE if c != "\r") and "\\u001b" not in dumped
        assert clean.details["x"] is None and clean.message.startswith("boom")


@needs_sandbox
def test_a_hostile_exception_message_is_stored_sent_and_shown_safely(tmp_path):
    problem = resolve("p28", catalog_for(ROOT / "problems"))
    record = grade(problem, KERNELS / "unsafe_text.py", "cutedsl", device="cpu", scale="smoke", timeout_s=120)
    assert record.status == Status.RUNTIME_ERROR
    shown = report(record, "submission 1")
    shown.encode("utf-8")  # what the model API sends
    assert not any(c in shown for c in UNSAFE)
    json.dumps(record.model_dump(mode="json"), allow_nan=False)  # mkb verify --json
    store = Store(tmp_path / "mkb.duckdb")
    eval_id = store.add_evaluation(record, "verify")
    assert eval_id and len(record.message) < 10_000


def test_the_harness_walks_only_exact_lists_and_tuples():
    """A timed call's result is walked after its window has closed (guards.copy_into): a container whose iteration,
    length, items or type name is the candidate's code would run that code, and its work, outside every measured
    window (tests/kernels/gpu_deferred_container.py). Such a result is another structure, and none of it runs."""
    import torch

    from mkb.judge.candidate import guards

    ran = []

    class Meta(type):
        @property
        def __name__(cls):
            ran.append("name")
            return "tuple"

    class Deferred(tuple, metaclass=Meta):
        def __iter__(self):
            ran.append("iter")
            return iter((torch.ones(2), torch.ones(2)))

        def __len__(self):
            ran.append("len")
            return 2

        def __getitem__(self, i):
            ran.append("getitem")
            return torch.ones(2)

    out, slots = Deferred((None,)), (torch.zeros(2), torch.zeros(2))
    assert guards.copy_into(slots, out) is False and not slots[0].any()
    assert guards.describe(out)["k"] == "other" and guards.tensor_leaves(out) == []
    assert guards.describe_shape(out) != guards.describe_shape(slots)
    assert ran == []
    assert guards.copy_into(slots, (torch.ones(2), torch.ones(2))) and slots[1].eq(1).all()
    assert guards.describe([torch.ones(1), (torch.ones(1),)])["type"] == "builtins.list"


def test_a_solve_commands_mode_travels_masked_and_only_the_key_unmasks_it():
    """The draw's mode is the knock-out's secret; the command pipe is the candidate's to read (knockout_pipe_tap)."""
    import secrets
    from collections import Counter

    from mkb.judge.candidate import knock, wire

    key, other = secrets.token_bytes(wire.MASK_KEY_BYTES), secrets.token_bytes(wire.MASK_KEY_BYTES)
    unmask, guess = wire.unmasker(key), wire.unmasker(other)
    sent = Counter()
    for _ in range(2000):
        nonce = secrets.token_hex(16)
        for mode in (knock.NORMAL, knock.OBSERVE, knock.KNOCK_NAN, knock.KNOCK_NOISE):
            flag = mode ^ wire.mask(key, nonce)
            assert unmask(flag, nonce) == mode
            sent[(mode, flag & 3)] += 1
            assert guess(flag, nonce) in range(256)
    # what the pipe shows is independent of the mode: its low bits spread evenly for every mode
    assert all(350 < sent[(mode, low)] < 650 for mode in range(4) for low in range(4))
    assert unmask(knock.KNOCK_NAN, None) == knock.NORMAL  # no nonce: nothing to knock out


def test_a_harness_stops_talking_once_its_pipes_are_replaced():
    import os

    from mkb.judge.candidate import wire

    cmd_r, cmd_w = os.pipe()
    reply_r, reply_w = os.pipe()
    recv, send, _, _ = wire.endpoint(cmd_r, reply_w)
    os.write(cmd_w, wire.frame({"cmd": "report"}, 0))
    assert recv() == ({"cmd": "report"}, 0)
    mine_r, mine_w = os.pipe()
    os.dup2(mine_r, cmd_r)
    os.write(mine_w, wire.frame({"cmd": "report"}, 0))
    with pytest.raises(wire.WireError, match="replaced"):
        recv()
    with pytest.raises(wire.WireError, match="replaced"):
        send({"ok": True})
    for fd in (cmd_r, cmd_w, reply_r, reply_w, mine_r, mine_w):
        os.close(fd)


@needs_sandbox
@pytest.mark.parametrize("fixture, dsl", [("knockout_pipe_tap", "tirx"), ("knockout_version_counter", "tirx"),
                                          ("mode_left_active", "cutedsl")])
def test_the_new_knock_out_and_deferral_attacks_fail_and_leave_nothing(fixture, dsl):
    """Graded in the sandbox with the test limits of tests/test_judge_sandbox.py: not passed, and no process, file or
    working directory of the grading remains (the pipe tap's forwarding thread dies with its process)."""
    from test_judge_sandbox import assert_nothing_left, settings

    problem = resolve("p28", catalog_for(ROOT / "problems"))
    record = grade(problem, KERNELS / f"{fixture}.py", dsl, device="cpu", scale="smoke", timeout_s=120,
                   settings=settings())
    assert record.status in (Status.POLICY_VIOLATION, Status.CRASHED), record.message
    assert_nothing_left()


def test_no_string_of_a_record_outgrows_its_cap():
    assert len(text("x" * (TEXT_CHARS + 5))) < TEXT_CHARS + 40 and text("x" * 10) == "x" * 10
    record = JudgeRecord(status=Status.RUNTIME_ERROR, message="m" * 10**6, problem="p28", dsl="cutedsl", device="cpu",
                         details={"traceback": "t" * 10**6, "nested": [{"k" * 10**5: "v"}]})
    clean = redact_record(record, {})
    assert len(clean.message) < MESSAGE_CHARS + 40 and len(json.dumps(clean.model_dump(mode="json"))) < 4 * TEXT_CHARS


@needs_sandbox
def test_a_forged_reply_frame_carries_no_flood_into_the_record():
    problem = resolve("p28", catalog_for(ROOT / "problems"))
    record = grade(problem, KERNELS / "forged_reply.py", "cutedsl", device="cpu", scale="smoke", timeout_s=120)
    assert record.status != Status.PASSED
    assert len(record.message) < MESSAGE_CHARS + 40
    assert len(json.dumps(record.model_dump(mode="json"))) < 200_000
    assert len(report(record, "submission 1")) < 20_000


def test_once_keyed_the_referee_takes_only_frames_the_harness_tagged():
    """A kernel holds the reply pipe's write end: a frame it writes there (tests/kernels/forged_profile_reply.py)
    carries no valid tag, whatever it says."""
    import os
    import secrets

    from mkb.judge.candidate import wire

    key = secrets.token_bytes(wire.MASK_KEY_BYTES)
    cmd_r, cmd_w = os.pipe()
    reply_r, reply_w = os.pipe()
    _, send, emit, authenticate = wire.endpoint(cmd_r, reply_w)
    seen = []
    referee = wire.Channel(reply_r, cmd_w, sink=seen.append)
    authenticate(key)
    referee.authenticate(key)
    emit({"ev": "call"})
    send({"ok": True, "n": 1})
    assert referee.recv() == {"ok": True, "n": 1} and seen == [{"ev": "call"}]
    forged = wire.frame({"ok": True, "cpu": True, "calls": []})
    os.write(reply_w, forged + bytes(wire.TAG_BYTES))
    with pytest.raises(wire.ForgedFrame):
        referee.recv()
    for fd in (cmd_r, cmd_w, reply_r, reply_w):
        os.close(fd)


@needs_sandbox
def test_a_forged_profile_reply_no_longer_buys_the_strict_share():
    from mkb.settings import Settings

    problem = resolve("p28", catalog_for(ROOT / "problems"))
    record = grade(problem, KERNELS / "forged_profile_reply.py", "tirx", device="cpu", scale="smoke", timeout_s=120,
                   settings=Settings(dsl_policy="strict"))
    assert record.status == Status.POLICY_VIOLATION and "did not write" in record.message
