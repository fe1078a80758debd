"""Protocol core: trial expansion, planning from the store, skill transfer and recording."""

from __future__ import annotations

import threading

import pytest
from pathlib import Path

from mkb.agent.budget import Budget, Usage
from mkb.problems import load_catalog
from mkb.protocol.plan import Action, expand, plan
from mkb.protocol.pool import JudgePool
from mkb.protocol.runner import NO_SKILL, ProtocolRun
from mkb.records import Arm, State, Status, TrialSpec
from mkb.settings import load_settings
from mkb.store import Trial
from mkb.trial import FingerprintParts, Outcome, Recorder, Transcript

PROBLEMS = load_catalog(load_settings().problems_dir)[:2]


def parts_for(spec: TrialSpec, skill_sha: str | None, problem_sha: str | None = None) -> FingerprintParts:
    return FingerprintParts(problem=problem_sha or spec.problem.fingerprint, templates="t", docs="d",
                            toolchain={"torch": "x"}, source_skill=skill_sha)


def test_expand_pulls_in_source_solos_and_names_trials():
    specs = expand(PROBLEMS[:1], [Arm.CUTEDSL2TIRX_SKILL], replicates=2)
    p = PROBLEMS[0].id
    assert [s.trial_id for s in specs] == [f"{p}_r1_solo_cutedsl", f"{p}_r1_cutedsl2tirx_skill",
                                           f"{p}_r2_solo_cutedsl", f"{p}_r2_cutedsl2tirx_skill"]
    assert specs[1].source_trial_id == f"{p}_r1_solo_cutedsl"
    only = expand(PROBLEMS[:1], list(Arm), 2, trial_glob="*_r2_tirx2cutedsl_skill")
    assert [s.trial_id for s in only] == [f"{p}_r2_solo_tirx", f"{p}_r2_tirx2cutedsl_skill"]


def stored(spec: TrialSpec, state: State = State.FINISHED, status: Status | None = None,
           parts: FingerprintParts | None = None) -> Trial:
    """A trial row as the store would hand it back."""
    return Trial(model="m", trial_id=spec.trial_id, problem_id=spec.problem.id, replicate=spec.replicate,
                 arm=spec.arm, dsl=spec.arm.dsl, state=state, status=status,
                 fingerprint_parts=parts.model_dump(mode="json") if parts else None)


def test_plan_actions_from_stored_rows():
    specs = expand(PROBLEMS[:1], list(Arm), 1)
    by_arm = {s.arm: s for s in specs}
    current = {s.trial_id: parts_for(s, "sha1" if s.arm.is_skill else None) for s in specs}
    stored_rows = [
        stored(by_arm[Arm.SOLO_CUTEDSL], parts=current[by_arm[Arm.SOLO_CUTEDSL].trial_id]),
        stored(by_arm[Arm.SOLO_TIRX], status=Status.INFRA_ERROR),
        stored(by_arm[Arm.CUTEDSL2TIRX_SKILL], parts=parts_for(specs[2], "old")),
        stored(by_arm[Arm.TIRX2CUTEDSL_SKILL]),
    ]
    stored_rows = {t.trial_id: t for t in stored_rows}
    actions = {i.spec.arm: (i.action, i.reason) for i in plan(specs, stored_rows, current)}
    assert actions[Arm.SOLO_CUTEDSL] == (Action.REUSE, "")
    assert actions[Arm.SOLO_TIRX][0] == Action.RERUN
    assert actions[Arm.CUTEDSL2TIRX_SKILL] == (Action.STALE, "changed: source_skill")
    assert actions[Arm.TIRX2CUTEDSL_SKILL] == (Action.RUN, "its source solo runs now")


def test_a_changed_problem_makes_finished_trials_stale():
    specs = expand(PROBLEMS[:1], [Arm.SOLO_TIRX], 1)
    old = parts_for(specs[0], None, problem_sha="before")
    items = plan(specs, {specs[0].trial_id: stored(specs[0], parts=old)},
                 {specs[0].trial_id: parts_for(specs[0], None)})
    assert (items[0].action, items[0].reason) == (Action.STALE, "changed: problem")


def _fake_attempt(store, skill_for: dict, seen: list, fail: set = frozenset(), ends: dict | None = None):
    def attempt(spec, ctx):
        seen.append((spec.trial_id, ctx.skill_text))
        Transcript(store, ctx.attempt_id).message(0, {"role": "user", "content": f"solve {spec.trial_id}"})
        if spec.trial_id in fail:
            raise RuntimeError("provider exploded")
        if (ends or {}).get(spec.trial_id):
            return Outcome(state=ends[spec.trial_id], message="scripted ending")
        return Outcome(state=State.FINISHED, status=Status.PASSED, speedup=1.5, kernel_ms=1.0, eager_ms=1.5,
                       skill_text=skill_for.get(spec.arm), usage=Usage(prompt_tokens=10, completion_tokens=5))
    return attempt


def _protocol(store, attempt, concurrency: int = 2) -> ProtocolRun:
    return ProtocolRun(store, Recorder(store, "m", "run1", Budget()), attempt, parts_for, concurrency=concurrency)


def test_run_transfers_skills_and_records_every_trial(store):
    specs = expand(PROBLEMS[:1], list(Arm), 1)
    items = plan(specs, {}, {s.trial_id: parts_for(s, None) for s in specs})
    seen: list = []
    skills = {Arm.SOLO_CUTEDSL: "tile rows, fuse the add", Arm.SOLO_TIRX: None}
    progress = _protocol(store, _fake_attempt(store, skills, seen)).run(items)
    p = PROBLEMS[0].id
    trials = {t.trial_id: t for t in store.trials("m")}
    assert progress.done == 4
    assert trials[f"{p}_r1_cutedsl2tirx_skill"].state == State.FINISHED
    assert trials[f"{p}_r1_cutedsl2tirx_skill"].skill_sha256 == store.skill("m", f"{p}_r1_solo_cutedsl").sha256
    assert (f"{p}_r1_cutedsl2tirx_skill", "tile rows, fuse the add") in seen
    # no SKILL.md is no skill: the dependent trial is skipped without an attempt
    assert trials[f"{p}_r1_tirx2cutedsl_skill"].state == State.SKIPPED
    assert f"{p}_r1_tirx2cutedsl_skill" not in [s for s, _ in seen]
    assert store.rows("SELECT count(*) AS n FROM messages") == [{"n": 3}]
    assert trials[f"{p}_r1_solo_cutedsl"].prompt_tokens == 10 and trials[f"{p}_r1_solo_cutedsl"].n_turns == 0


def test_a_rerun_source_without_skill_hands_over_no_older_skill(store):
    """The skill a skill trial gets is its source's current attempt's, never one an earlier attempt left."""
    specs = expand(PROBLEMS[:1], [Arm.CUTEDSL2TIRX_SKILL], 1)
    source, skill = specs[0].trial_id, specs[1].trial_id
    items = plan(specs, {}, {s.trial_id: parts_for(s, None) for s in specs})
    _protocol(store, _fake_attempt(store, {Arm.SOLO_CUTEDSL: "an old skill"}, [])).run(items)
    assert store.skill("m", source).text == "an old skill"
    seen: list = []
    progress = _protocol(store, _fake_attempt(store, {}, seen)).run(items)  # the rerun leaves no SKILL.md
    assert progress.done == 2 and store.skill("m", source) is None
    assert store.trial("m", skill).state == State.SKIPPED and skill not in [s for s, _ in seen]


def test_a_skill_trial_waits_while_its_source_has_not_finished(store):
    specs = expand(PROBLEMS[:1], [Arm.CUTEDSL2TIRX_SKILL], 1)
    source, skill = specs[0].trial_id, specs[1].trial_id
    items = plan(specs, {}, {s.trial_id: parts_for(s, None) for s in specs})
    _protocol(store, _fake_attempt(store, {Arm.SOLO_CUTEDSL: "a skill"}, [])).run(items)
    seen: list = []
    progress = _protocol(store, _fake_attempt(store, {}, seen, ends={source: State.INFRA_ERROR})).run(items)
    assert [s for s, _ in seen] == [source] and (progress.done, progress.total) == (1, 1)
    assert store.trial("m", source).state == State.INFRA_ERROR
    assert store.trial("m", skill).state == State.FINISHED  # the earlier result stands until the source finishes


def test_a_crashing_attempt_is_an_infra_error_and_the_run_goes_on(store):
    specs = expand(PROBLEMS, [Arm.SOLO_TIRX], 1)
    items = plan(specs, {}, {s.trial_id: parts_for(s, None) for s in specs})
    bad = specs[0].trial_id
    _protocol(store, _fake_attempt(store, {}, [], fail={bad}), concurrency=4).run(items)
    states = {t.trial_id: t.state for t in store.trials("m")}
    assert states == {bad: State.INFRA_ERROR, specs[1].trial_id: State.FINISHED}
    attempt = store.find_attempt(bad)
    assert attempt.state == State.INFRA_ERROR and attempt.message == "RuntimeError: provider exploded"
    rerun = plan(specs, {t.trial_id: t for t in store.trials("m")}, {s.trial_id: parts_for(s, None) for s in specs})
    assert [i.action for i in rerun] == [Action.RERUN, Action.REUSE]


def test_judge_pool_runs_one_job_per_slot_and_reports_queue_time():
    active, peak, lock = [0], [0], threading.Lock()
    gate = threading.Event()

    def grade(x, device_slot):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        gate.wait(5)
        with lock:
            active[0] -= 1
        return (x, device_slot)

    pool = JudgePool(grade, ["0", "1"])
    futures = [pool.submit(i, label=str(i)) for i in range(5)]
    gate.set()
    results = [f.result(timeout=10) for f in futures]
    pool.close()
    assert sorted(r.record[0] for r in results) == list(range(5))
    assert {r.worker for r in results} <= {"0", "1"} and peak[0] <= 2
    assert all(r.queue_s >= 0 for r in results)
    with pytest.raises(ValueError):
        JudgePool(grade, [])


def test_the_oracle_plans_only_problems_with_shipped_solutions(store):
    """On the H200, `--problems 'p0[1-9]*'` had the oracle submit placeholder kernels for p02-p09."""
    from mkb import protocol
    from mkb.errors import MkbError

    settings = load_settings()
    solved = sorted(p.stem for p in (Path(__file__).resolve().parent.parent / "problems/solutions/tirx").glob("p*.py"))
    unsolved = [f"p{n:02d}" for n in range(1, 10) if f"p{n:02d}" not in solved]
    assert unsolved and "p01" in solved  # the slice must hold both kinds for this test to mean anything
    request = protocol.RunRequest(model=protocol.ORACLE, problems=["p0[1-9]*"], arms=[Arm.SOLO_TIRX])
    assert [i.spec.trial_id for i in protocol.make_plan(settings, store, request)] == \
        [f"{p}_r1_solo_tirx" for p in solved if p < "p10"]
    with pytest.raises(MkbError, match=f"covers {', '.join(solved[:2])}"):
        protocol.make_plan(settings, store, protocol.RunRequest(model=protocol.ORACLE, problems=[unsolved[0]]))
    other = protocol.RunRequest(model="some/model", problems=["p0[1-2]"], arms=[Arm.SOLO_TIRX])
    assert len(protocol.make_plan(settings, store, other)) == 2


# -- skills keyed by attempt, through the real agent loop and the scripted server ------------------------------

SCRIPTED = "openai/gpt-x"


def _passing(problem, kernel_path, dsl, device_slot="cpu"):
    from mkb.records import JudgeRecord

    return JudgeRecord(status=Status.PASSED, problem=problem.id, dsl=dsl, device="cuda", kernel_ms=1.0,
                       eager_ms=2.0, speedup=2.0, draws=[{"seed": i, "ok": True} for i in range(5)])


def _lost(problem, kernel_path, dsl, device_slot="cpu"):
    from mkb.records import JudgeRecord

    return JudgeRecord(status=Status.INFRA_ERROR, problem=problem.id, dsl=dsl, device="cuda", message="GPU lost")


def _execute(store, tmp_path, llm_server, steps, items, grade):
    from scripted_server import call, reply

    from mkb import protocol

    finish = [reply(calls=[call("finish", {})]), reply(calls=[call("finish", {})])]
    llm_server.script([step for s in steps for step in [*s, *finish]])
    request = protocol.RunRequest(model=SCRIPTED, base_url=llm_server.base_url, concurrency=1, command="test")
    return protocol.execute(load_settings(home=tmp_path / "home", device="cpu"), store, request, items, grade=grade)


def _writes(*files):
    from scripted_server import call, reply

    return [reply(calls=[call("write_file", {"path": path, "content": text})]) for path, text in files]


KERNEL = ("kernel.py", "import torch\n\ndef solve(*inputs):\n    return inputs[0]\n")


def test_a_rerun_solo_without_skill_md_passes_on_no_older_attempts_skill(store, tmp_path, llm_server):
    from mkb.protocol.plan import PlanItem
    from mkb.store import Skill

    solo, skill = expand(PROBLEMS[:1], [Arm.CUTEDSL2TIRX_SKILL], 1)
    _execute(store, tmp_path, llm_server, [_writes(KERNEL, ("SKILL.md", "keep rows in registers"))],
             [PlanItem(spec=solo, action=Action.RUN)], _passing)
    first = store.trial(SCRIPTED, solo.trial_id).attempt_id
    assert store.skill(SCRIPTED, solo.trial_id).text == "keep rows in registers"
    _execute(store, tmp_path, llm_server, [_writes(KERNEL), _writes(KERNEL)],
             [PlanItem(spec=solo, action=Action.RERUN), PlanItem(spec=skill, action=Action.RUN)], _passing)
    rerun = store.trial(SCRIPTED, solo.trial_id)
    assert rerun.attempt_id != first and store.skill(SCRIPTED, solo.trial_id) is None
    assert [s.attempt_id for s in store.select(Skill)] == [first]  # kept, under the attempt that wrote it
    skipped = store.trial(SCRIPTED, skill.trial_id)
    assert (skipped.state, skipped.message, skipped.skill_sha256) == (State.SKIPPED, NO_SKILL, None)
    assert len(llm_server.requests) == 3  # the rerun solo's three replies: the skill arm made no attempt


def test_a_skill_trial_runs_only_from_a_finished_source(store, tmp_path, llm_server):
    from mkb.protocol.plan import PlanItem, plan

    solo, skill = expand(PROBLEMS[:1], [Arm.CUTEDSL2TIRX_SKILL], 1)
    items = [PlanItem(spec=solo, action=Action.RUN), PlanItem(spec=skill, action=Action.RUN)]
    progress = _execute(store, tmp_path, llm_server, [_writes(KERNEL, ("SKILL.md", "a skill"))], items, _lost)
    source = store.trial(SCRIPTED, solo.trial_id)
    assert (source.state, source.status) == (State.FINISHED, Status.INFRA_ERROR)  # its final grading was lost
    assert store.trial(SCRIPTED, skill.trial_id) is None and (progress.done, progress.total) == (1, 1)
    stored_rows = {t.trial_id: t for t in store.trials(SCRIPTED)}
    again = plan([solo, skill], stored_rows, {s.trial_id: parts_for(s, None) for s in (solo, skill)})
    assert [i.action for i in again] == [Action.RERUN, Action.RUN]
    _execute(store, tmp_path, llm_server, [_writes(KERNEL, ("SKILL.md", "a better skill")), _writes(KERNEL)], again,
             _passing)
    ran = store.trial(SCRIPTED, skill.trial_id)
    assert (ran.state, ran.status) == (State.FINISHED, Status.PASSED)
    assert "a better skill" in store.messages(ran.attempt_id)[1].content
