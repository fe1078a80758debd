"""What the agent is told about its submissions: kernels refused before grading (never charged), the report's
correct draws, and tracebacks cut down to the kernel's own frames."""

from __future__ import annotations

import pytest
from attempt_kit import FINISH, GOOD_KERNEL, FakeJudge, run, tool_results
from scripted_server import call, reply

from mkb.agent import Budget
from mkb.agent.conditions import KERNEL_BYTE_LIMIT
from mkb.agent.feedback import kernel_traceback, precheck, report
from mkb.records import JudgeRecord, Status

__all__ = ["run"]  # a fixture, imported from attempt_kit

JUDGE_TRACEBACK = """Traceback (most recent call last):
  File "/opt/mkb/mkb/judge/child.py", line 108, in cmd_load
    module = self._import(self.spec["kernel"], "kernel")
             ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/opt/mkb/mkb/judge/child.py", line 120, in _import
    spec.loader.exec_module(module)
  File "<frozen importlib._bootstrap_external>", line 940, in exec_module
  File "<frozen importlib._bootstrap>", line 241, in _call_with_frames_removed
  File "/dev/shm/mkb-judge-87n16l0t/kernel/kernel.py", line 4, in <module>
    table = build()
            ^^^^^^^
  File "/dev/shm/mkb-judge-87n16l0t/kernel/kernel.py", line 2, in build
    return torch.nn.functional.linear(x, w)
  File "/usr/lib/python3/site-packages/torch/nn/functional.py", line 77, in linear
    raise RuntimeError(msg)
RuntimeError: mat1 and mat2 shapes cannot be multiplied
  File "/opt/mkb/mkb/judge/hooks.py", line 1, in forged
    a frame line the kernel printed into its own exception message
"""


def test_the_traceback_keeps_the_kernels_frames_and_the_libraries_it_called():
    text = kernel_traceback(JUDGE_TRACEBACK)
    assert "mkb/judge" not in text and "frozen importlib" not in text and "/dev/shm" not in text
    assert 'File "kernel.py", line 4, in <module>' in text and "table = build()" in text
    assert 'File "kernel.py", line 2, in build' in text and "torch/nn/functional.py" in text
    assert text.startswith("Traceback (most recent call last):")
    assert text.endswith("RuntimeError: mat1 and mat2 shapes cannot be multiplied")
    assert "self._import" not in text and "forged" not in text


@pytest.mark.parametrize("source, reason", [
    ("", "kernel.py is empty"),
    ("  \n\t\n", "kernel.py is empty"),
    ("def solve(:\n", "does not parse: invalid syntax (line 1)"),
    ("x = '\0'\n", "does not parse"),
    ("x = " + "(" * 5000 + ")" * 5000 + "\n", "does not parse"),
    ("#" * (KERNEL_BYTE_LIMIT + 1), f"over the {KERNEL_BYTE_LIMIT}-byte limit"),
    ("s = '" + "é" * (KERNEL_BYTE_LIMIT // 2) + "'\n", "bytes, over the"),  # bytes, not characters
])
def test_kernels_that_cannot_be_graded_are_named_before_grading(source, reason):
    assert reason in precheck(source)


def test_a_valid_kernel_passes_the_precheck():
    assert precheck(GOOD_KERNEL) is None and precheck("#" * KERNEL_BYTE_LIMIT) is None


def test_empty_oversized_and_unparsable_kernels_are_not_charged(run):
    judge = FakeJudge()
    result, transcript, _, _ = run([
        reply(calls=[call("submit", {})]),  # kernel.py is still the empty file of the workspace
        reply(calls=[call("write_file", {"path": "kernel.py", "content": "#" * (KERNEL_BYTE_LIMIT + 10)}),
                     call("submit", {})]),
        reply(calls=[call("write_file", {"path": "kernel.py", "content": "def solve(:\n"}), call("submit", {})]),
        reply(calls=[call("write_file", {"path": "kernel.py", "content": GOOD_KERNEL}), call("submit", {})]),
        reply(calls=[call("bash", {"command": "mv kernel.py k.py && ln -s /etc/hostname kernel.py"}),
                     call("submit", {})]),  # a link out of the workspace cannot be read, and is not charged
        reply(calls=[call("bash", {"command": "rm kernel.py && printf 'def solve(*a) return' > kernel.py"})]),
        *FINISH,
    ], budget=Budget(n_submissions=2), judge=judge)
    results = tool_results(transcript)
    assert results[0].startswith("not submitted: kernel.py is empty") and "submissions left: 2 of 2" in results[0]
    assert "over the 300000-byte limit" in results[2] and "submissions left: 2 of 2" in results[2]
    assert "does not parse" in results[4] and "does not count" in results[4]
    assert "passed: yes" in results[6] and "submissions left: 1 of 2" in results[6]
    assert results[8].startswith("not submitted: kernel.py cannot be read") and "left: 1 of 2" in results[8]
    assert judge.sources == [GOOD_KERNEL]  # neither the refused submissions nor the unparsable final reached it
    assert result.n_submissions == 1 and [s.kind for s in result.submissions] == ["feedback", "final"]
    final = result.final
    assert (final.status, final.device) == (Status.IMPORT_ERROR, "none") and "does not parse" in final.message


def test_reports_count_correct_draws_and_show_the_filtered_traceback():
    raised = JudgeRecord(status=Status.RUNTIME_ERROR, problem="p32", dsl="cutedsl", device="cuda",
                         message="draw 2: solve() raised RuntimeError: mat1 and mat2", log_tail="print noise",
                         draws=[{"seed": 1, "ok": True}], details={"traceback": JUDGE_TRACEBACK})
    text = report(raised, "submission 2 (feedback)", redact=lambda t: t.replace("mat1", "[redacted]"))
    assert "correct: no (1 of 5 draws)" in text and "imported: yes" in text and "passed: no" in text
    assert 'File "kernel.py", line 4' in text and "mkb/judge" not in text and "print noise" not in text
    assert "mat1" not in text and "[redacted] and mat2" in text
    not_imported = JudgeRecord(status=Status.IMPORT_ERROR, problem="p32", dsl="cutedsl", device="cuda",
                               message="importing kernel.py failed: SyntaxError", details={"traceback": 42})
    assert "imported: no" in report(not_imported, "final") and "traceback" not in report(not_imported, "final")


@pytest.mark.parametrize("device, scale", [("cpu", "smoke"), pytest.param("cuda", "full", marks=pytest.mark.gpu)])
def test_the_judge_runs_all_five_draws_after_a_wrong_answer_and_the_report_counts_them(device, scale):
    from pathlib import Path

    from mkb.judge import grade
    from mkb.problems import catalog_for, resolve

    root = Path(__file__).resolve().parent.parent
    record = grade(resolve("p28", catalog_for(root / "problems")), root / "tests" / "kernels" / "alternating_p28.py",
                   "cutedsl", device=device, scale=scale)
    assert record.status == Status.INCORRECT and record.message.startswith("draw 2:")
    assert [d.ok for d in record.draws] == [True, False, True, False, True]
    assert "correct: no (3 of 5 draws)" in report(record, "submission 1 (feedback)")
