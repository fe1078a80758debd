"""scripts/gpu_job.sh: a detached gpu_session.sh job, refused twice at once, packed into one file for the device call."""

import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _job(args, job: Path, out: Path | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin:/usr/local/bin", "JOB": str(job), "HOME": str(job.parent)}
    if out is not None:
        env["OUT"] = str(out)
    return subprocess.run(["bash", "scripts/gpu_job.sh", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_a_job_runs_detached_and_comes_back_as_one_tarball(tmp_path):
    job, out = tmp_path / "job", tmp_path / "out"
    out.mkdir()
    assert _job(["start"], job).returncode == 2  # no stages named
    started = _job(["start", "no-such-stage"], job)
    assert started.returncode == 0, started.stderr
    waited = _job(["wait", "60"], job, out)
    assert "job ended (exit 2)" in waited.stdout  # gpu_session.sh refuses the unknown stage
    assert sorted(p.name for p in out.iterdir()) == ["job.tar.gz", "session_tail.log"]
    with tarfile.open(out / "job.tar.gz") as tar:
        names = tar.getnames()
    assert "job/session.log" in names and "job/exit" in names
    tail = (out / "session_tail.log").read_text()
    assert "unknown stage no-such-stage" in tail
    assert "GPU key: cpu" in tail   # no GPU here: no file is named after one (h200.json, mkb-h200.duckdb, ...)
    assert "idle (last exit 2)" in _job(["status"], job).stdout


def test_a_second_start_is_refused_while_a_job_runs(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        (job / "pid").write_text(str(sleeper.pid))
        refused = _job(["start", "solutions"], job)
        assert refused.returncode == 2 and "a job is running" in refused.stderr
        assert "still running after 1s" in _job(["wait", "1"], job).stdout
    finally:
        sleeper.kill()
