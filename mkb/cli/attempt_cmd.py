"""`mkb attempt` and `mkb replay`: run one recorded attempt with a model, or re-run a recorded one without."""

from __future__ import annotations

import json

import click

from mkb.cli import console, emit, output_options, settings_from
from mkb.errors import MkbError
from mkb.records import DSLS, Dsl

SANDBOX_HELP = ("local: bubblewrap (falls back loudly to a plain subprocess); docker: a container from --image; "
                "none: no isolation.")


def run_options(fn):
    """--db, --device, --sandbox and --image: where an attempt (or its replay) is stored, graded and run."""
    fn = click.option("--image", default="mkb:latest", envvar="MKB_IMAGE", show_default=True,
                      help="Image for --sandbox docker.")(fn)
    fn = click.option("--sandbox", type=click.Choice(["local", "docker", "none"]), default="local",
                      envvar="MKB_SANDBOX", show_default=True, help=SANDBOX_HELP)(fn)
    fn = click.option("--device", type=click.Choice(["cuda", "cpu"]),
                      help="Where the judge runs kernels (default: auto); cpu grades at smoke scale, for tests.")(fn)
    return click.option("--db", type=click.Path(dir_okay=False),
                        help="Results database (default: <home>/mkb.duckdb).")(fn)


def _judge(device: str, settings):
    """grade_for(problem, dsl) -> grade(kernel_path) on the real judge; on the CPU at smoke scale (test mode)."""
    from mkb.protocol import judge_grader

    grade = judge_grader(settings, device)
    return lambda problem, dsl: (lambda kernel_path: grade(problem, kernel_path, dsl))


def _device_and_gpu(device: str | None, settings):
    """The judge device (cuda or cpu) and the GPU the instruction names."""
    from mkb.agent import Gpu

    device = device or settings.device
    if device == "auto":
        from mkb.environment import gpus

        device = "cuda" if gpus() else "cpu"
    if device == "cpu":
        return device, Gpu(name="CPU (test mode: kernels are graded on the CPU at smoke scale)", arch="sm_90a")
    from mkb.environment import gpus

    found = gpus()
    if not found:
        raise MkbError("--device cuda, but no CUDA GPU is visible. Use --device cpu to grade on the CPU.")
    return device, Gpu(name=found[0]["name"], arch=found[0]["arch"])


def _summary(recorded) -> dict:
    r = recorded.result
    return {"trial_id": recorded.trial_id, "attempt_id": recorded.attempt_id, "state": r.state,
            "status": str(r.status) if r.status else None, "speedup": r.speedup, "ending": r.ending,
            "n_submissions": r.n_submissions, "n_turns": r.usage.n_turns, "prompt_tokens": r.usage.prompt_tokens,
            "completion_tokens": r.usage.completion_tokens, "wall_s": round(r.wall_s, 1), "isolation": r.isolation}


@click.command(name="attempt")
@click.argument("problem")
@click.option("--dsl", type=click.Choice([str(d) for d in DSLS]), required=True, help="The variant's DSL.")
@click.option("--model", "model_spec", required=True,
              help="provider/model (openai, openrouter, deepseek, dashscope, vllm, sglang), or a plain name with --base-url.")
@click.option("--skill", type=click.Path(exists=True, dir_okay=False), help="A SKILL.md to transfer (runs the skill arm).")
@click.option("--base-url", help="OpenAI-compatible endpoint; overrides the provider's (env MKB_BASE_URL).")
@click.option("--api-key-env", help="Variable holding the API key (default: the provider's, e.g. OPENROUTER_API_KEY).")
@run_options
@click.option("--budget-min", type=float, default=40.0, show_default=True, help="Agent wall clock in minutes.")
@click.option("--submissions", type=int, default=10, show_default=True, help="Feedback submissions allowed.")
@click.option("--max-turns", type=int, help="Cap on model replies.")
@click.option("--max-tokens", type=int, help="Cap on prompt + completion tokens over the attempt.")
@click.option("--temperature", type=float, help="Sampling temperature.")
@click.option("--top-p", type=float, help="Nucleus sampling.")
@click.option("--max-output-tokens", type=int, help="Cap on tokens per reply.")
@click.option("--reasoning-effort", type=click.Choice(["minimal", "low", "medium", "high"]), help="For reasoning models.")
@click.option("--extra-body", help="JSON object of provider-specific request fields.")
@output_options
@click.pass_context
def attempt(ctx, problem, dsl, model_spec, skill, base_url, api_key_env, db, device, sandbox, image, budget_min,
            submissions, max_turns, max_tokens, temperature, top_p, max_output_tokens, reasoning_effort, extra_body,
            json_=False, csv_=False):
    """Run one attempt at a problem variant with a model, and store it (trial p<NN>_r1_<arm>).

    Example:

    \b
        mkb attempt p28 --dsl cutedsl --model openrouter/qwen/qwen3-coder
        mkb attempt p28 --dsl tirx --model my-model --base-url http://127.0.0.1:8000/v1 --skill SKILL.md
    """
    from pathlib import Path

    from mkb.agent import Budget, ChatModel, parse_model_spec
    from mkb.problems import catalog_for, resolve
    from mkb.store import Store
    from mkb.trial import run_trial

    settings = settings_from(ctx, db=db, base_url=base_url)
    from mkb.judge import prepare_host  # a dead run's judge leftovers go; SIGTERM cleans up

    prepare_host()
    info = resolve(problem, catalog_for(settings.problems_dir))
    try:
        extra = json.loads(extra_body) if extra_body else {}
    except json.JSONDecodeError as exc:
        raise MkbError(f"--extra-body is not valid JSON ({exc.msg}). Example: --extra-body '{{\"top_k\": 20}}'") from None
    config = parse_model_spec(model_spec, settings.base_url, api_key_env, temperature=temperature, top_p=top_p,
                              max_output_tokens=max_output_tokens, reasoning_effort=reasoning_effort,
                              extra_body=extra or None)
    model = ChatModel(config)
    device, gpu = _device_and_gpu(device, settings)
    grade = _judge(device, settings)(info, Dsl(dsl))
    budget = Budget(wall_s=budget_min * 60, n_submissions=submissions, max_turns=max_turns, max_tokens=max_tokens)
    skill_text = Path(skill).read_text(encoding="utf-8") if skill else None
    if skill_text is not None and not skill_text.strip():
        raise MkbError(f"--skill {skill} is empty: a skill arm needs a skill to transfer. Drop --skill for a solo attempt.")
    with Store(settings.db_path) as store:
        console.print(f"{info.id} {dsl} with {config.spec}: sandbox {sandbox}, judge on {device}, db {settings.db_path}")
        recorded = run_trial(store, settings, info, Dsl(dsl), config, model, grade=grade, budget=budget,
                             skill_text=skill_text, sandbox=sandbox, image=image, gpu=gpu)
    emit([_summary(recorded)], json_, csv_, title="attempt")


@click.command(name="replay")
@click.argument("trial_or_attempt")
@run_options
@output_options
@click.pass_context
def replay(ctx, trial_or_attempt, db, device, sandbox, image, json_=False, csv_=False):
    """Re-run a recorded attempt's tool calls in a fresh workspace, without a model, and re-grade.

    The replay is stored as a new attempt of the same trial; the table compares each grading.

    Example:

    \b
        mkb replay p28_r1_solo_cutedsl --device cuda --json
    """
    from mkb.store import Store
    from mkb.trial import replay as replay_attempt

    settings = settings_from(ctx, db=db)
    device, gpu = _device_and_gpu(device, settings)
    grade_for = _judge(device, settings)
    with Store(settings.db_path) as store:
        original, recorded = replay_attempt(store, settings, trial_or_attempt, grade_for=grade_for, sandbox=sandbox,
                                            image=image, gpu=gpu)
        before = {r["n"]: r for r in store.rows("SELECT * FROM submissions WHERE attempt_id = ?",
                                                [original["attempt_id"]])}
    rows = []
    for s in recorded.result.submissions:
        old = before.get(s.n, {})
        rows.append({"n": s.n, "kind": s.kind, "recorded_status": old.get("status"),
                     "recorded_speedup": old.get("speedup"), "replay_status": str(s.record.status),
                     "replay_speedup": s.record.speedup, "same_kernel": old.get("kernel_sha256") == s.kernel_sha256})
    console.print(f"replay of {original['attempt_id']} stored as attempt {recorded.attempt_id}")
    emit(rows, json_, csv_, title=f"replay of {original['trial_id']}",
         columns=["n", "kind", "recorded_status", "recorded_speedup", "replay_status", "replay_speedup", "same_kernel"])


def register(main: click.Group) -> None:
    main.add_command(attempt)
    main.add_command(replay)
