"""The protocol on a local Ray instance (2 CPUs, no GPU): attempts as Ray tasks, judge actors in CPU mode,
the driver the only writer; a killed attempt worker and a killed judge actor are infra errors, not charged.

Ray is an optional extra: without it this module skips (make test-ray installs it and runs these).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (an optional extra): pip install 'mkb[ray]', "
                                        "or run make test-ray")

from click.testing import CliRunner  # noqa: E402
from scripted_server import Hold, call, reply  # noqa: E402

from mkb import protocol  # noqa: E402
from mkb.protocol.plan import Action  # noqa: E402
from mkb.protocol.ray_channel import Inbox  # noqa: E402
from mkb.protocol.ray_executor import RayOptions  # noqa: E402
from mkb.protocol.ray_judges import JudgeQueue  # noqa: E402
from mkb.records import Arm, JudgeRecord, Status  # noqa: E402
from mkb.settings import load_settings  # noqa: E402
from mkb.store import Message, Store, now  # noqa: E402

pytestmark = pytest.mark.ray

KERNELS = Path(__file__).resolve().parent / "kernels"
VALID_TIRX_P28 = (KERNELS / "valid_tirx_p28.py").read_text()
SKILL = "Row reduction: one pass per row, fp32 sum of squares.\n"


@pytest.fixture(scope="module")
def cluster():
    """A local Ray instance for the module; this module's functions travel to workers by value."""
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def fake_grade(problem, kernel_path, dsl, device_slot="cpu"):
    """Deterministic stand-in for the judge: passes, with a speedup that depends on the kernel source."""
    source = Path(kernel_path).read_text()
    speedup = 1.0 + len(source) % 9 / 10
    return JudgeRecord(status=Status.PASSED, problem=problem.id, dsl=dsl, device="cpu", kernel_ms=1.0,
                       eager_ms=speedup, speedup=speedup, details={"slot": device_slot})


def smoke_judge(problem, kernel_path, dsl, device_slot="cpu"):
    """The real judge in its CPU mode at smoke scale."""
    from mkb.judge import grade

    return grade(problem, kernel_path, dsl, device="cpu", scale="smoke")


def run_on_ray(db: Path, request, grade=fake_grade, **kw):
    settings = load_settings(device="cpu")
    with Store(db) as store:
        items = protocol.check_stale(protocol.make_plan(settings, store, request), False)
        progress = protocol.execute(settings, store, request, items, ray=RayOptions(), grade=grade, **kw)
        return items, progress, store.trials(request.model)


def _ray_compare():
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "artifact" / "generators" / "ray_compare.py"
    spec = importlib.util.spec_from_file_location("ray_compare", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def results(db: Path, model: str) -> dict:
    with Store(db, read_only=True) as store:
        return {t.trial_id: (t.state, t.status, t.speedup, t.skill_sha256, t.n_submissions)
                for t in store.trials(model)}, store.rows(
            "SELECT t.trial_id, m.seq, m.role FROM messages m JOIN trials t USING (attempt_id) ORDER BY ALL")


def test_reference_run_on_ray_matches_the_local_executor(cluster, tmp_path):
    request = protocol.RunRequest(model="reference", problems=["p28"], concurrency=2)
    settings = load_settings(device="cpu")
    with Store(tmp_path / "local.duckdb") as store:
        items = protocol.make_plan(settings, store, request)
        protocol.execute(settings, store, request, items, grade=fake_grade)
    items, progress, trials = run_on_ray(tmp_path / "ray.duckdb", request)
    assert [i.action for i in items] == [Action.RUN] * 4 and progress.by_state == {"finished": 4}
    local, ray_ = results(tmp_path / "local.duckdb", "reference"), results(tmp_path / "ray.duckdb", "reference")
    assert ray_ == local  # statuses, speedups, transferred skills, submissions, whole transcripts
    compared = _ray_compare().compare(str(tmp_path / "local.duckdb"), str(tmp_path / "ray.duckdb"))
    assert (compared["compared"], compared["agree"]) == (4, 4)  # the script the H200 check uses
    assert all(t.status == Status.PASSED and t.queue_s >= 0 for t in trials)
    with Store(tmp_path / "ray.duckdb", read_only=True) as store:
        assert store.rows("SELECT kind, status FROM submissions ORDER BY ALL") == \
            [{"kind": "feedback", "status": "passed"}] * 4 + [{"kind": "final", "status": "passed"}] * 4
        assert store.rows("SELECT state, command FROM runs") == [{"state": "finished", "command": "run-model"}]
    # the driver restarted: everything is reused, nothing runs again
    items, progress, _ = run_on_ray(tmp_path / "ray.duckdb", request)
    assert [i.action for i in items] == [Action.REUSE] * 4 and progress.total == 0
    with Store(tmp_path / "ray.duckdb") as store:  # a speedup 50% off is beyond the noise floor
        with store.transaction() as con:
            con.execute("UPDATE trials SET speedup = speedup * 1.5 WHERE trial_id = 'p28_r1_solo_tirx'")
    compared = _ray_compare().compare(str(tmp_path / "local.duckdb"), str(tmp_path / "ray.duckdb"))
    assert compared["agree"] == 3 and [r["trial"] for r in compared["trials"] if not r["agree"]] == ["p28_r1_solo_tirx"]


def test_a_scripted_model_graded_by_the_real_judge_on_a_cpu_judge_actor(cluster, tmp_path, llm_server):
    pytest.importorskip("mkb.judge", reason="the judge is not importable")
    llm_server.script([
        reply(calls=[call("write_file", {"path": "kernel.py", "content": VALID_TIRX_P28})]),
        reply(calls=[call("write_file", {"path": "SKILL.md", "content": SKILL})]),
        reply("Done.", calls=[call("finish", {"summary": "tirx row norm"})]),
        reply("Confirmed.", calls=[call("finish", {})]),  # finish asks first
    ])
    request = protocol.RunRequest(model="scripted", base_url=llm_server.base_url, problems=["p28"],
                                  arms=[Arm.SOLO_TIRX])
    _, progress, trials = run_on_ray(tmp_path / "mkb.duckdb", request, grade=smoke_judge)
    assert [(t.state, t.status, t.n_turns) for t in trials] == [("finished", "passed", 4)]
    with Store(tmp_path / "mkb.duckdb", read_only=True) as store:
        [final] = store.rows("SELECT kind, status, kernel_source, record FROM submissions")
        assert (final["kind"], final["status"], final["kernel_source"]) == ("final", "passed", VALID_TIRX_P28)
        assert '"dsl_check": "passed"' in final["record"] or '"dsl_check":"passed"' in final["record"]
        assert store.skill("scripted", "p28_r1_solo_tirx").text == SKILL
        roles = [m.role for m in store.messages(trials[0].attempt_id)]
    assert roles == ["system", "user"] + ["assistant", "tool"] * 4 + ["user"]
    assert len(llm_server.requests) == 4


def _kill_attempt_worker(trial_id: str, hold: Hold, killed: list) -> None:
    """SIGKILL the Ray worker process running the trial's attempt once its model request is in flight."""
    if not hold.reached.wait(60):
        return
    title = f"ray::attempt:{trial_id}".encode()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if cmdline.read_bytes().startswith(title):
                os.kill(int(cmdline.parent.name), signal.SIGKILL)
                killed.append(int(cmdline.parent.name))
        except (OSError, ValueError):
            continue


def test_a_killed_attempt_worker_is_an_infra_error_and_the_next_run_reruns_it(cluster, tmp_path, llm_server):
    request = protocol.RunRequest(model="scripted", base_url=llm_server.base_url, problems=["p28"],
                                  arms=[Arm.SOLO_TIRX])
    hold, killed = Hold(reply(calls=[call("finish", {})]), timeout_s=60), []
    llm_server.script([hold])
    killer = threading.Thread(target=_kill_attempt_worker, args=("p28_r1_solo_tirx", hold, killed))
    killer.start()
    try:
        _, progress, trials = run_on_ray(tmp_path / "mkb.duckdb", request)
    finally:
        hold.release()
        killer.join()
    assert killed and progress.by_state == {"infra_error": 1}
    [lost] = trials
    assert lost.state == "infra_error" and "Ray worker running the attempt was lost" in lost.message
    with Store(tmp_path / "mkb.duckdb", read_only=True) as store:
        # what was written before the kill stays: the instruction and the kickoff message
        assert [m.role for m in store.messages(lost.attempt_id)] == ["system", "user"]
    llm_server.script([reply(calls=[call("write_file", {"path": "kernel.py", "content": VALID_TIRX_P28})]),
                       reply(calls=[call("finish", {})]), reply(calls=[call("finish", {})])])
    items, progress, trials = run_on_ray(tmp_path / "mkb.duckdb", request)
    assert [(i.action, i.reason) for i in items] == [(Action.RERUN, "last ended infra_error")]
    assert [(t.state, t.status) for t in trials] == [("finished", "passed")]
    with Store(tmp_path / "mkb.duckdb", read_only=True) as store:
        assert store.rows("SELECT state FROM attempts ORDER BY started_at") == [
            {"state": "infra_error"}, {"state": "finished"}]


def blocking_grade(fifo: str, marker: str):
    """A grade that, the first time, tells the test through a FIFO that it is grading, then hangs."""
    def grade(problem, kernel_path, dsl, device_slot="cpu"):
        if not os.path.exists(marker):
            Path(marker).touch()
            with open(fifo, "w") as pipe:
                pipe.write("grading\n")
            threading.Event().wait(120)  # killed long before
        return fake_grade(problem, kernel_path, dsl, device_slot)
    return grade


def test_a_lost_judge_actor_is_restarted_and_the_evaluation_retried(cluster, tmp_path):
    fifo, marker = tmp_path / "grading.fifo", tmp_path / "graded-once"
    os.mkfifo(fifo)
    pools = []

    def kill_judge():
        with open(fifo) as pipe:
            pipe.readline()
        ray.kill(pools[0].workers[0], no_restart=False)  # Ray restarts it; the evaluation in flight is lost

    killer = threading.Thread(target=kill_judge)
    killer.start()
    request = protocol.RunRequest(model="reference", problems=["p28"], arms=[Arm.SOLO_TIRX])
    _, _, trials = run_on_ray(tmp_path / "mkb.duckdb", request, grade=blocking_grade(str(fifo), str(marker)),
                              on_pool=pools.append)
    killer.join()
    assert [(t.state, t.status, t.n_submissions) for t in trials] == [("finished", "passed", 1)]
    with Store(tmp_path / "mkb.duckdb", read_only=True) as store:
        rows = store.rows("SELECT kind, status, queue_s FROM submissions ORDER BY n")
    assert [(r["kind"], r["status"]) for r in rows] == [("feedback", "passed"), ("final", "passed")]
    assert rows[0]["queue_s"] >= 1.0  # the retry's wait is queue time, not charged to the attempt


def _judge_takes_visible_devices() -> bool:
    import inspect

    from mkb.judge import grade

    return "visible_devices" in inspect.signature(grade).parameters


@pytest.mark.skipif(not _judge_takes_visible_devices(),
                    reason="mkb.judge.grade takes no visible_devices yet, which protocol.judge_grader passes")
def test_run_model_cli_with_the_ray_executor(cluster, tmp_path):
    from mkb.cli import main

    db = tmp_path / "cli.duckdb"
    # the real judge in CPU mode grades the shipped GPU solution once (no feedback submissions): it cannot run
    result = CliRunner().invoke(main, ["--db", str(db), "run-model", "reference", "--problems", "p28", "--arms",
                                       "solo_tirx", "--submissions", "0", "--executor", "ray", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert "1 trials run" in result.stderr
    with Store(db, read_only=True) as store:
        assert [t.state for t in store.trials("reference")] == ["finished"]


# -- the actors' logic, driven directly (no Ray scheduling) -----------------------------------------


class _Worker:
    """A judge worker whose grade.remote() returns a future the test resolves."""

    def __init__(self):
        self.calls: list[asyncio.Future] = []
        self.grade = self

    def remote(self, problem, source, dsl):
        self.calls.append(asyncio.get_running_loop().create_future())
        return self.calls[-1]


def test_judge_queue_grades_one_at_a_time_retries_lost_workers_and_reports_queue_time():
    from ray.exceptions import ActorDiedError, ActorUnavailableError

    from mkb.problems import catalog_for, resolve

    p28 = resolve("p28", catalog_for(load_settings().problems_dir))
    clock, worker = [100.0], _Worker()
    record = JudgeRecord(status=Status.PASSED, problem="p28", dsl="tirx", device="cpu")

    async def until(n: int) -> None:
        while len(worker.calls) < n:
            await asyncio.sleep(0)

    async def scenario():
        queue = JudgeQueue([worker], ["node:0"], "cpu", timeout_s=60, backoff_s=(0.0,), now=lambda: clock[0])
        first = asyncio.create_task(queue.grade(p28, "src", "tirx"))
        second = asyncio.create_task(queue.grade(p28, "src", "tirx"))
        await until(1)
        assert await queue.queued() == 1
        clock[0] += 5.0
        worker.calls[0].set_exception(ActorUnavailableError("restarting", None))  # retried once
        await until(2)
        worker.calls[1].set_result(record)
        graded = await first
        await until(3)
        worker.calls[2].set_exception(ActorDiedError())
        await until(4)
        worker.calls[3].set_exception(ActorDiedError())  # out of retries
        return graded, await second

    graded, lost = asyncio.run(scenario())
    assert (graded.record, graded.queue_s, graded.worker) == (record, 0.0, "node:0")
    assert lost.queue_s == 5.0 and lost.record.status == Status.INFRA_ERROR
    assert "judge worker node:0 was lost during the evaluation (ActorDiedError, 2 tries)" in lost.record.message


def test_inbox_releases_a_put_only_once_written_and_passes_cancel_on():
    def message(seq: int) -> Message:
        return Message(attempt_id="a", seq=seq, role="user", content="x", created_at=now())

    async def scenario():
        inbox = Inbox()
        put = asyncio.create_task(inbox.put(message(0)))
        [(key, row)] = await inbox.take(1.0)
        assert row == message(0).model_copy(update={"created_at": row.created_at}) and not put.done()
        await inbox.cancel()
        await inbox.ack({key: None})
        cancelled = await put
        failing = asyncio.create_task(inbox.put(message(1)))
        [(key, _)] = await inbox.take(1.0)
        await inbox.ack({key: "ConstraintException: duplicate key"})
        with pytest.raises(RuntimeError, match="could not record a Message row"):
            await failing
        return cancelled, await inbox.take(0.01)

    assert asyncio.run(scenario()) == (True, [])


def test_an_unreachable_cluster_address_fails_fast():
    from mkb.protocol.ray_executor import _check_reachable

    with pytest.raises(ConnectionRefusedError):
        _check_reachable("ray://127.0.0.1:1")
    for address in (None, "auto", "local"):
        _check_reachable(address)  # left to ray.init
