"""The judge's sandbox against real attacks: every tests/kernels/attack_*.py graded in it (real processes).

Each attack must get a non-passed status or read nothing, and afterwards no process, file or
working directory of it may remain. Canaries stand for the runner's secrets: one variable whose
name looks like a credential (redaction would hide it) and one whose name does not (only the
sandbox and the allow-listed environment keep it out).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from test_judge import KERNELS, ROOT, fixture_facts

from mkb.judge import grade, leftovers, sandbox
from mkb.judge.launch import HARNESS_DIR, discard_spares
from mkb.problems import catalog_for, resolve
from mkb.records import Status
from mkb.settings import load_settings

CANARIES = {"H26_CANARY_PLAIN": "plain-canary-7f3a9c51", "H26_CANARY_API_KEY": "key-canary-1b2c3d4e5f"}
SOLUTION_TEXT = (ROOT / "problems/solutions/cutedsl/p28.py").read_text().splitlines()[0]
PROBLEM_TEXT = "Llama-3.1-8B"
ATTACKS = sorted(KERNELS.glob("attack_*.py"))
MARKS = ("mkb-attack-write-host", "mkb-attack-hoard", "mkb-attack-survivor", "mkb-attack-socket")
needs_sandbox = pytest.mark.skipif(sandbox.find()[0] is None, reason=f"no sandbox here: {sandbox.find()[1]}")


def judge_processes(marker: str) -> list[tuple[int, list[str]]]:
    """(pid, argv) of every process on the machine whose command line holds marker."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if any(marker in a for a in argv):
                found.append((int(entry.name), argv))
    return found


def host_marks() -> list[Path]:
    """Files an attack left where the host would keep them."""
    places = [Path(tempfile.gettempdir()), Path("/dev/shm"), Path("/var/tmp"), Path.home(), ROOT, HARNESS_DIR,
              Path(sys.executable).parent, Path(sys.prefix), Path(__import__("torch").__file__).parent]
    return [p / name for p in places for name in ("mkb-attack-write-host", "mkb-attack-hoard-0") if (p / name).exists()]


def assert_nothing_left() -> None:
    discard_spares()
    prefix = f"mkb-judge-{os.getpid()}."
    assert judge_processes(prefix) == [] and judge_processes("mkb-attack-survivor") == []
    assert not list(Path(tempfile.gettempdir()).glob(f"{prefix}*"))
    assert host_marks() == []


@pytest.fixture(scope="module")
def catalog():
    return catalog_for(ROOT / "problems")


@pytest.fixture
def canaries(monkeypatch):
    for name, value in CANARIES.items():
        monkeypatch.setenv(name, value)
    return CANARIES


def settings(**overrides):
    return load_settings(**{"judge_spares": 0, "judge_memory_mb": 4096, **overrides})


@pytest.fixture
def unix_listener():
    """A UNIX socket listening in the host's /tmp; .connections counts what reached it."""
    path = Path(tempfile.gettempdir()) / "mkb-attack-socket"
    path.unlink(missing_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()
    server.settimeout(0.2)
    state = {"connections": 0, "stop": False}

    def accept():
        while not state["stop"]:
            try:
                server.accept()[0].close()
                state["connections"] += 1
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield state
    state["stop"] = True
    thread.join(2)
    server.close()
    path.unlink(missing_ok=True)


@needs_sandbox
@pytest.mark.parametrize("path", ATTACKS, ids=[p.stem for p in ATTACKS])
def test_an_attack_reads_nothing_and_leaves_nothing(path, catalog, canaries, unix_listener):
    facts = fixture_facts(path)
    record = grade(resolve(facts["problem"], catalog), path, facts["dsl"], device="cpu", scale="smoke",
                   settings=settings(judge_memory_mb=facts["memory_mb"] or 4096), timeout_s=120)
    assert record.status in {facts["expected"], *facts["also"]}, \
        f"{facts['hack']}\n{record.message}\n{record.log_tail[-2000:]}"
    text = record.model_dump_json()
    for secret in (*canaries.values(), *canaries.keys(), SOLUTION_TEXT, PROBLEM_TEXT):
        assert secret not in text, f"{path.stem} read {secret!r}"
    assert unix_listener["connections"] == 0
    assert "PID" in record.details["isolation"]["namespaces"]
    if record.status == Status.PASSED:  # its processes ended before the verdict (as before eager timing on a GPU)
        assert record.details["candidate_stop"]["left"] == 0
    assert_nothing_left()


@pytest.mark.parametrize("name, leaked", [("attack_read_solutions", "solutions/cutedsl/p28.py"),
                                          ("attack_reference_runpy", None)])
def test_the_attacks_are_real_without_a_sandbox(name, leaked, catalog, monkeypatch):
    """Graded in plain processes (the explicit unsafe setting), the same kernels do read the solutions; running the
    problem file through runpy is refused by the candidate's seal even there (a code file outside the installed
    libraries, issue #24)."""
    monkeypatch.setenv("PATH", "/nonexistent")  # no bwrap: find() reports no sandbox
    sandbox.find.cache_clear()
    try:
        refused = grade(resolve("p28", catalog), KERNELS / f"{name}.py", "cutedsl", device="cpu", scale="smoke",
                        settings=settings())
        assert refused.status == Status.INFRA_ERROR and "no OS sandbox" in refused.message
        assert "seccomp=unconfined" in refused.message and "MKB_JUDGE_UNSAFE_NO_SANDBOX" in refused.message
        unsafe = grade(resolve("p28", catalog), KERNELS / f"{name}.py", "cutedsl", device="cpu", scale="smoke",
                       settings=settings(judge_unsafe_no_sandbox=True))
    finally:
        sandbox.find.cache_clear()
    assert unsafe.details["isolation"]["sandbox"].startswith("none")
    if leaked:
        assert leaked in unsafe.message
    else:
        assert unsafe.status == Status.POLICY_VIOLATION and "forbidden at run time" in unsafe.message, unsafe.message
    assert_nothing_left()


def _candidate_sleeping(prefix: str, deadline_s: float = 180.0) -> None:
    """Wait until the sandboxed candidate of the judge whose launches start with prefix sleeps inside solve()."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for pid, argv in judge_processes(prefix):
            if any(a.endswith("child.py") for a in argv) and "python" in argv[0]:
                try:
                    if Path(f"/proc/{pid}/syscall").read_text().split()[0] in ("35", "230"):  # (clock_)nanosleep
                        return
                except (OSError, IndexError):
                    pass
        time.sleep(0.1)
    raise AssertionError("the candidate never reached solve()")


@needs_sandbox
def test_a_referee_killed_while_the_kernel_runs_is_charged(catalog):
    """The candidate cannot reach its referee from the sandbox; if the referee dies anyway once kernel.py is
    loaded (the kernel shares the machine with it), the grading is crashed, not a free infra_error."""
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("record", grade(
        resolve("p28", catalog), KERNELS / "sleeper.py", "cutedsl", device="cpu", scale="smoke",
        settings=settings(), timeout_s=300)))
    thread.start()
    prefix = f"mkb-judge-{os.getpid()}."
    _candidate_sleeping(prefix)
    referee = [pid for pid, argv in judge_processes(prefix) if "-c" in argv and "python" in argv[0]]
    assert len(referee) == 1
    os.kill(referee[0], signal.SIGKILL)
    thread.join(120)
    record = result["record"]
    assert record.status == Status.CRASHED and "while kernel.py was loaded" in record.message
    assert_nothing_left()


def test_a_referee_dead_before_the_kernel_loads_is_the_judges(tmp_path):
    """The same death before the referee let kernel.py import is infra_error (no candidate code had run)."""
    from types import SimpleNamespace

    from mkb.judge.evaluation import Evaluation
    from mkb.judge.processes import Child, Limits, Tail

    def child(name, code):
        popen = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        popen.wait(30)
        return Child(name, popen, Tail(popen.stdout, 1 << 16), Tail(popen.stderr, 1 << 16), Limits())

    for said, status in ((b"ready", Status.INFRA_ERROR), (b"readyL", Status.CRASHED)):
        evaluation = Evaluation.__new__(Evaluation)
        evaluation.start_s, evaluation.launch = 0.1, SimpleNamespace(signals={"referee": said})
        evaluation.stops, evaluation.reliefs = [], []
        evaluation.children = {"referee": child("referee", "import os; os.kill(os.getpid(), 9)"),
                               "candidate": child("candidate", "pass")}
        evaluation.ended = {name: c.popen.returncode for name, c in evaluation.children.items()}
        verdict, _, _ = evaluation._verdict("done", 10.0)
        assert verdict["status"] == status and "SIGKILL" in verdict["message"]


def test_a_relief_that_cannot_start_is_reported_to_the_referee_and_recorded():
    """The parent's side of a relief (Evaluation._relieve) when no fresh candidate can start: the referee reads
    relieved: false and why (stop.relieve), the record keeps how the old one ended and its log."""
    from types import SimpleNamespace

    from mkb.judge.evaluation import Evaluation
    from mkb.judge.launch import LaunchError
    from mkb.judge.processes import Child, Limits, Tail
    from mkb.judge.referee import stop

    code = "import os, sys; sys.stderr.write('the first error\\n'); sys.stderr.flush(); os.abort()"
    popen = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    popen.wait(30)
    control_r, control_w = os.pipe()
    ready_r, ready_w = os.pipe()

    def start_relief(spec):
        raise LaunchError("all 2 fresh candidate processes of this grading were used")

    evaluation = Evaluation.__new__(Evaluation)
    evaluation.children = {"candidate": Child("candidate", popen, Tail(popen.stdout, 1 << 16),
                                              Tail(popen.stderr, 1 << 16), Limits())}
    evaluation.launch = SimpleNamespace(start_relief=start_relief, control=control_w)
    evaluation.reliefs, evaluation.closed, evaluation.candidate_spec = [], set(), {}
    evaluation._relieve(time.monotonic)
    account = stop.relieve(ready_w, control_r, wait_s=5.0)
    assert os.read(ready_r, 1) == b"R"
    assert account["relieved"] is False and "were used" in account["why"] and "SIGABRT" in account["exit"]
    recorded, = evaluation.reliefs
    assert recorded["relieved"] is False and "SIGABRT" in recorded["exit"] and recorded["left"] == 0
    assert "the first error" in recorded["log_head"] and "the first error" in recorded["log_tail"]
    for fd in (control_r, control_w, ready_r, ready_w):
        os.close(fd)


@needs_sandbox
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_nothing_survives_the_judges_death(how, tmp_path):
    """mkb verify stopped mid-grading: its processes die with it; SIGTERM cleans up its working directory,
    after kill -9 the next command's sweep does."""
    verify = subprocess.Popen([sys.executable, "-m", "mkb", "verify", "p28", "--dsl", "cutedsl",
                               str(KERNELS / "sleeper.py"), "--device", "cpu", "--scale", "smoke", "--timeout", "300"],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              env={**os.environ, "MKB_JUDGE_SPARES": "0"})
    prefix = f"mkb-judge-{verify.pid}."
    _candidate_sleeping(prefix)
    verify.send_signal(how)
    verify.wait(60)
    deadline = time.monotonic() + 30
    while judge_processes(prefix) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert judge_processes(prefix) == []
    left = list(Path(tempfile.gettempdir()).glob(f"{prefix}*"))
    if how == signal.SIGTERM:
        assert left == [] and verify.returncode != 0
    else:
        assert left and set(leftovers.sweep()) >= set(left)
        assert not any(p.exists() for p in left)


def test_the_sweep_removes_only_what_dead_owners_left(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    me = os.getpid()
    names = [f"mkb-judge-{dead.pid}.{12345}-abc", f"mkb-submissions-{dead.pid}-xyz",  # owners gone
             f"mkb-judge-{me}.{leftovers.start_time(me)}-abc", f"mkb-submissions-{me}-xyz",  # alive
             f"mkb-judge-{me}.1-reused", "mkb-judge-oldstyle", "unrelated"]  # a reused pid; names not ours
    for name in names:
        (tmp_path / name).mkdir()
    removed = {p.name for p in leftovers.sweep((tmp_path,))}
    assert removed == {names[0], names[1], names[4]}
    assert {p.name for p in tmp_path.iterdir()} == set(names) - removed


def test_a_secret_the_runner_holds_never_reaches_the_record(catalog, tmp_path, monkeypatch):
    """Redaction, the second line: a kernel that prints and raises a value it should never have had."""
    secret = "sk-test-0123456789abcdef"
    monkeypatch.setenv("H26_PROVIDER_API_KEY", secret)
    kernel = tmp_path / "kernel.py"
    kernel.write_text("import base64, sys\n"
                      f"S = {secret[::-1]!r}[::-1]\n"
                      "def solve(x, residual, weight):\n"
                      "    print(S, base64.b64encode(S.encode()).decode(), S[::-1], file=sys.stderr)\n"
                      "    raise RuntimeError('key ' + S.encode().hex())\n")
    record = grade(resolve("p28", catalog), kernel, "cutedsl", device="cpu", scale="smoke",
                   settings=settings(judge_unsafe_no_sandbox=True))
    assert record.status == Status.RUNTIME_ERROR and "[redacted]" in record.message
    text = record.model_dump_json()
    assert secret not in text and secret.encode().hex() not in text and secret[::-1] not in text
    assert "[redacted]" in record.log_tail


def test_the_judges_environment_is_allow_listed():
    from mkb.judge.credentials import judge_environment, looks_like_credential, secret_values

    runner = {"PATH": "/usr/bin", "OPENROUTER_API_KEY": "sk-or-1234567890", "HF_TOKEN": "hf_abcdefghijk",
              "GITHUB_PAT": "ghp_abcdefghijkl", "DB_PASSWD": "hunter2hunter2", "MKB_HOME": "/results",
              "CUDA_VISIBLE_DEVICES": "0", "TVM_API_KEY": "tvm-key-123456", "LC_ALL": "C", "HOME": "/root",
              "AWS_SECRET_ACCESS_KEY": "aws/secret+value", "PWD": "/work/mkb"}
    assert judge_environment(runner, trusted=False) == {"PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "0", "LC_ALL": "C"}
    assert judge_environment(runner, trusted=True)["HOME"] == "/root"
    assert [n for n in runner if looks_like_credential(n)] == ["OPENROUTER_API_KEY", "HF_TOKEN", "GITHUB_PAT",
                                                              "DB_PASSWD", "TVM_API_KEY", "AWS_SECRET_ACCESS_KEY"]
    assert "sk-or-1234567890" in secret_values(runner) and "/work/mkb" not in secret_values(runner)


def test_the_package_follows_its_trust_boundaries():
    """candidate/ imports nothing of mkb (the sandbox shows only that folder); referee/ imports nothing of the
    parent; speed no longer imports the referee (the cycle is gone)."""
    import ast

    def imports(path: Path) -> set[str]:
        tree = ast.parse(path.read_text())
        return {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | \
               {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}

    judge = ROOT / "mkb" / "judge"
    for path in (judge / "candidate").glob("*.py"):
        assert not any(m.startswith("mkb") for m in imports(path)), path
    parent = {p.stem for p in judge.glob("*.py")} - {"__init__"}
    for path in (judge / "referee").glob("*.py"):
        assert not any(m.startswith("mkb.judge.") and m.split(".")[2] in parent for m in imports(path)), path
    assert "mkb.judge.referee.referee" not in imports(judge / "referee" / "speed.py")


def test_doctor_says_which_isolation_the_judge_has(monkeypatch):
    from mkb.doctor import _judge_sandbox

    found = _judge_sandbox(settings())
    if sandbox.find()[0] is not None:
        assert found.state == "ok" and "PID" in found.detail and "65534" in found.detail
    monkeypatch.setenv("PATH", "/nonexistent")
    sandbox.find.cache_clear()
    try:
        missing = _judge_sandbox(settings())
        unsafe = _judge_sandbox(settings(judge_unsafe_no_sandbox=True))
    finally:
        sandbox.find.cache_clear()
    assert missing.state == "fail" and "bubblewrap" in missing.detail and "seccomp=unconfined" in missing.fix
    assert unsafe.state == "warn" and "plain processes" in unsafe.detail


@pytest.mark.gpu
@needs_sandbox
def test_the_sandbox_holds_on_the_gpu():
    """scripts/gpu_sandbox_check.py's two parts: CUDA IPC works across the judge's cell (and the record of what
    it needs), and every attack, graded as a CuTe DSL and a TIRx kernel, is contained."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_sandbox_check", ROOT / "scripts" / "gpu_sandbox_check.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    cell = check.ipc_variants()["judge cell"]
    assert cell["consumer_event_opened_by_producer"] == "ok", cell
    assert cell["consumer"]["producer_event_opened"] == "ok", cell
    assert cell["consumer"]["memory_with_torch_event"] == check.EXPECTED_SUM, cell
    rows = check.attacks()
    assert all(row["ok"] for row in rows), [row for row in rows if not row["ok"]]


def test_a_toolchain_under_tmp_is_bound_over_the_cells_private_tmp():
    """A checkout (and its .venv) under /tmp: the cell's private /tmp must not hide the interpreter."""
    from mkb.judge.view import View

    venv = "/tmp/clone/.venv"
    args = View(readonly=("/usr", venv), symlinks=(), hidden=(), placed=(), devices=(), tmp_bytes=1 << 20).bwrap_args()
    tmp = next(i for i in range(len(args) - 1) if args[i:i + 2] == ["--tmpfs", "/tmp"])
    bind = next(i for i in range(len(args) - 2) if args[i:i + 3] == ["--ro-bind", venv, venv])
    assert tmp < bind and args.count("/tmp") == 2  # mounted once, then the venv on top of it (and --chdir /tmp)


def test_a_cells_tmpfs_counts_but_the_hosts_disk_never_does(tmp_path):
    """The memory watchdog adds the files in a cell's /tmp and the grading's /dev/shm to its resident memory. A process
    caught before it entered the sandbox's mounts shows the host's filesystems there: their use is not the
    candidate's (the host disk's 44 GB once killed a relief process under a 32 GiB limit, processes.tmpfs_mb)."""
    from mkb.judge import processes

    host = processes._devices("/", "/tmp", "/dev/shm")
    assert processes._used_bytes(str(tmp_path), host) == 0 and processes._used_bytes("/", host) == 0
    assert processes._used_bytes(str(tmp_path), set()) > 0  # the same path, were it not the host's: its disk's use
    assert processes._used_bytes(str(tmp_path / "missing"), set()) == 0
