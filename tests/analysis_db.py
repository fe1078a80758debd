"""Results databases with known outcomes, built through the Store API (for the analysis tests)."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

from mkb.agent.tools import Submission
from mkb.records import FAMILIES, FAMILY_SIZES, Arm, JudgeRecord, ProblemInfo, State
from mkb.store import Attempt, Run, Skill, Store, Trial, now
from mkb.trial import Transcript


def add_problem(store: Store, number: int, family: str) -> str:
    """Record a problem in the problems table; returns its id."""
    store.upsert_problems([ProblemInfo(
        number=number, name=f"problem_{number:02d}", family=family, path=f"/x/{number:02d}.py",
        description="d", source="s", dtype="bf16", sol_flops=1.0, sol_bytes=1.0, fingerprint="f")])
    return f"p{number:02d}"


def add_trial(store: Store, model: str, problem: str, arm: Arm | str, replicate: int = 1,
              state: str = "finished", status: str | None = "passed", speedup: float | None = 1.0,
              **fields) -> str:
    """Record one trial (p<NN>_r<k>_<arm>); speedup is dropped unless passed."""
    arm = Arm(arm)
    trial_id = f"{problem}_r{replicate}_{arm}"
    if arm.is_skill:
        fields.setdefault("source_trial_id", f"{problem}_r{replicate}_{arm.source}")
    store.put(Trial(model=model, trial_id=trial_id, problem_id=problem, replicate=replicate, arm=arm, dsl=arm.dsl,
                    state=state, status=status if state == "finished" else None,
                    speedup=speedup if status == "passed" and state == "finished" else None, **fields))
    return trial_id


def add_skill(store: Store, model: str, trial_id: str, text: str) -> None:
    """Record the skill a solo trial's current attempt left (the trial gets an attempt id if it had none)."""
    trial = store.trial(model, trial_id)
    attempt_id = (trial.attempt_id if trial else None) or f"attempt-{model}-{trial_id}"
    if trial is not None and trial.attempt_id is None:
        store.put(trial.model_copy(update={"attempt_id": attempt_id}))
    store.put(Skill(attempt_id=attempt_id, model=model, trial_id=trial_id, text=text,
                    sha256=hashlib.sha256(text.encode()).hexdigest(), created_at=now()))


def add_run(store: Store, run_id: str, model: str, is_oracle: bool = False) -> None:
    """Record a run (the oracle flag is what the analysis reads from it)."""
    store.put(Run(run_id=run_id, model=model, is_oracle=is_oracle, started_at=now()))


def add_cell_trials(store: Store, model: str, problem: str, speedups: dict, replicate: int = 1) -> None:
    """Four arms at once: speedups maps arm -> speedup (passed), None (failed: incorrect),
    'skipped', 'infra_error' or 'missing'."""
    for arm in Arm:
        value = speedups.get(arm, speedups.get(str(arm), "missing"))
        if value == "missing":
            continue
        if value == "skipped":
            add_trial(store, model, problem, arm, replicate, state="skipped", status=None)
        elif value == "infra_error":
            add_trial(store, model, problem, arm, replicate, state="infra_error", status=None)
        elif value is None:
            add_trial(store, model, problem, arm, replicate, status="incorrect")
        else:
            add_trial(store, model, problem, arm, replicate, speedup=value,
                      prompt_tokens=10_000, completion_tokens=2_000, cost_usd=0.5, wall_s=600.0,
                      queue_s=5.0, n_submissions=3)


def build_known(store: Store, model: str = "m") -> None:
    """Five problems with hand-checked outcomes (see test_analysis.py for the expected values)."""
    sc, st, c2t, t2c = Arm.SOLO_CUTEDSL, Arm.SOLO_TIRX, Arm.CUTEDSL2TIRX_SKILL, Arm.TIRX2CUTEDSL_SKILL
    for number, family in ((1, "attention"), (2, "attention"), (3, "moe"), (4, "kv_cache"), (5, "quantization")):
        add_problem(store, number, family)
    add_cell_trials(store, model, "p01", {sc: 2.0, st: 1.0, c2t: 1.05, t2c: 4.0})
    add_cell_trials(store, model, "p02", {sc: None, st: 0.5, c2t: "skipped", t2c: 32.0})
    add_cell_trials(store, model, "p03", {sc: 1.0, c2t: 1.0, t2c: None})
    add_trial(store, model, "p03", st, status="infra_error")
    add_cell_trials(store, model, "p04", {sc: 0.25, c2t: 0.5})
    add_trial(store, model, "p04", st, state="running", status=None)
    add_trial(store, model, "p04", t2c, state="interrupted", status=None)
    add_cell_trials(store, model, "p05", {sc: 1.0, st: 1.0, c2t: "infra_error", t2c: 1 / 1.05})


def demo_db(path: Path, models: tuple[str, ...] = ("model-a", "model-b", "model-c"), seed: int = 7) -> Path:
    """A full-size synthetic database (74 problems, the given models plus the reference oracle)."""
    rng = random.Random(seed)
    with Store(path) as store:
        number = 1
        problems = []
        for family in FAMILIES:
            for _ in range(FAMILY_SIZES[family]):
                problems.append(add_problem(store, number, family))
                number += 1
        add_run(store, "run-oracle", "reference", is_oracle=True)
        for m, model in enumerate((*models, "reference")):
            skill_pass = 0.35 + 0.1 * m
            for problem in problems:
                for arm in Arm:
                    oracle = model == "reference"
                    roll = rng.random()
                    if not oracle and arm.is_skill and roll < 0.04:
                        add_trial(store, model, problem, arm, state="skipped", status=None)
                        continue
                    if not oracle and roll > 0.98:
                        add_trial(store, model, problem, arm, state="infra_error", status=None)
                        continue
                    p_pass = 1.0 if oracle else (skill_pass + 0.1 if arm.is_skill else skill_pass)
                    passed = rng.random() < p_pass
                    speedup = round(2 ** rng.gauss(0.3 if oracle else -0.2, 1.2), 3)
                    add_trial(store, model, problem, arm, status="passed" if passed else "incorrect",
                              speedup=speedup, prompt_tokens=rng.randint(50_000, 400_000),
                              completion_tokens=rng.randint(5_000, 60_000),
                              cost_usd=None if oracle else round(rng.uniform(0.2, 4.0), 2),
                              wall_s=rng.uniform(300, 2400), queue_s=rng.uniform(0, 60),
                              n_submissions=rng.randint(1, 10))
                    if not arm.is_skill and rng.random() < 0.97:
                        add_skill(store, model, f"{problem}_r1_{arm}", f"skill for {problem} {arm}")
    return path


def judge_record(problem: str, dsl: str, status: str = "passed", speedup: float | None = 2.0,
                 dsl_share: float | None = None, message: str = "") -> JudgeRecord:
    """A GPU judge record as the judge writes it (timings only when passed; details.dsl_share when given)."""
    timed = {"kernel_ms": 1.0, "eager_ms": speedup, "speedup": speedup} if status == "passed" else {}
    return JudgeRecord(status=status, problem=problem, dsl=dsl, device="cuda", message=message or status,
                       details={} if dsl_share is None else {"dsl_share": dsl_share}, **timed)


def add_transcript(store: Store, model: str, trial_id: str, messages: list[dict],
                   gradings: list[tuple[str, JudgeRecord, str]], ended: str = "finish: the agent called finish",
                   attempt_id: str | None = None) -> str:
    """Record an attempt of a trial the way the protocol does: its messages as they happen, its gradings
    (kind, record, kernel source), its end. Returns the attempt id, for add_trial(..., attempt_id=...)."""
    attempt_id = attempt_id or f"a-{model}-{trial_id}".replace("/", "-")
    store.put(Attempt(attempt_id=attempt_id, model=model, trial_id=trial_id, state=State.RUNNING, started_at=now()))
    transcript = Transcript(store, attempt_id)
    for seq, message in enumerate(messages):  # raw rows: the site must cope with whatever a database holds
        extra = message.get("extra") or {}
        store.insert("messages", {"attempt_id": attempt_id, "seq": seq, "role": message.get("role", ""),
                                  "content": message.get("content"), "tool_calls": message.get("tool_calls"),
                                  "tool_call_id": message.get("tool_call_id"), "name": message.get("name"),
                                  "prompt_tokens": extra.get("prompt_tokens"),
                                  "completion_tokens": extra.get("completion_tokens"), "extra": extra,
                                  "created_at": now()})
    for n, (kind, record, source) in enumerate(gradings, start=1):
        transcript.submission(Submission(n=n, kind=kind, record=record, kernel_source=source,
                                         kernel_sha256=hashlib.sha256(source.encode()).hexdigest()))
    final = gradings[-1][1] if gradings else None
    store.put(Attempt(attempt_id=attempt_id, model=model, trial_id=trial_id, state=State.FINISHED,
                      status=final.status if final else None, message=ended, started_at=now(), finished_at=now()))
    return attempt_id
