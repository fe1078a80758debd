"""`mkb attempt` and `mkb replay`: run one recorded attempt with a model, or re-run a recorded one without."""

from __future__ import annotations

import json
from pathlib import Path

import click

from mkb.cli import (command_line, console, db_option, emit, exit_on_infra_errors, infra_failed, output_options,
                     protocol_options, require_writable_home, run_options, settings_from)
from mkb.errors import MkbError
from mkb.records import DSLS, Arm, Dsl


def arm_for(dsl: Dsl, with_skill: bool) -> Arm:
    """The arm of a single attempt: solo, or the skill arm that targets dsl."""
    if not with_skill:
        return Arm(f"solo_{dsl}")
    return Arm.CUTEDSL2TIRX_SKILL if dsl == Dsl.TIRX else Arm.TIRX2CUTEDSL_SKILL


def _summary(trial, attempt) -> dict:
    usage = attempt.usage or {}
    return {"trial_id": trial.trial_id, "attempt_id": attempt.attempt_id, "state": trial.state,
            "status": trial.status, "speedup": trial.speedup, "message": trial.message,
            "n_submissions": trial.n_submissions, "n_turns": trial.n_turns, "prompt_tokens": trial.prompt_tokens,
            "completion_tokens": trial.completion_tokens, "wall_s": round(trial.wall_s or 0.0, 1),
            "isolation": attempt.sandbox, "reasoning_tokens": usage.get("reasoning_tokens")}


def _skill_text(skill: str | None) -> str | None:
    text = Path(skill).read_text(encoding="utf-8") if skill else None
    if text is not None and not text.strip():
        raise MkbError(f"--skill {skill} is empty: a skill arm needs a skill to transfer. Drop --skill for a solo attempt.")
    return text


@click.command(name="attempt")
@click.argument("problem")
@click.option("--dsl", type=click.Choice([str(d) for d in DSLS]), required=True, help="The variant's DSL.")
@click.option("--model", "model_spec", required=True,
              help="provider/model (openai, openrouter, deepseek, dashscope, vllm, sglang), or a plain name with --base-url.")
@click.option("--skill", type=click.Path(exists=True, dir_okay=False), help="A SKILL.md to transfer (runs the skill arm).")
@click.option("--base-url", help="OpenAI-compatible endpoint; overrides the provider's (env MKB_BASE_URL).")
@click.option("--api-key-env", help="Variable holding the API key (default: the provider's, e.g. OPENROUTER_API_KEY).")
@db_option
@run_options
@protocol_options
@click.option("--budget-min", type=float, default=40.0, show_default=True, help="Wall clock in minutes (see --clock).")
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
def attempt(ctx, problem, dsl, model_spec, skill, base_url, api_key_env, device, sandbox, image, clock, context_full,
            manual_examples, budget_min, submissions, max_turns, max_tokens, temperature, top_p, max_output_tokens,
            reasoning_effort, extra_body, json_=False, csv_=False):
    """Run one attempt at a problem variant with a model, and store it (trial p<NN>_r1_<arm>).

    It runs exactly as the trial would in `mkb run-model`, and records the same rows. Exits 3 when the
    trial ends in infra_error (provider or judge failed; not charged): run it again to retry.

    Example:

    \b
        mkb attempt p28 --dsl cutedsl --model openrouter/qwen/qwen3-coder
        mkb attempt p28 --dsl tirx --model my-model --base-url http://127.0.0.1:8000/v1 --skill SKILL.md
    """
    from mkb import protocol
    from mkb.agent import Budget
    from mkb.agent.sandboxes import check_sandbox
    from mkb.problems import catalog_for, resolve
    from mkb.protocol.plan import Action, PlanItem
    from mkb.records import TrialSpec
    from mkb.store import Store

    settings = settings_from(ctx, base_url=base_url, device=device, sandbox=sandbox, image=image, clock=clock,
                             context_full=context_full, manual_examples=manual_examples)
    from mkb.judge import prepare_host  # a dead run's judge leftovers go; SIGTERM cleans up

    prepare_host()
    info = resolve(problem, catalog_for(settings.problems_dir))
    try:
        extra = json.loads(extra_body) if extra_body else {}
    except json.JSONDecodeError as exc:
        raise MkbError(f"--extra-body is not valid JSON ({exc.msg}). Example: --extra-body '{{\"top_k\": 20}}'") from None
    sampling = {"temperature": temperature, "top_p": top_p, "max_output_tokens": max_output_tokens,
                "reasoning_effort": reasoning_effort, "extra_body": extra or None}
    request = protocol.RunRequest(
        model=model_spec, concurrency=1, base_url=settings.base_url, api_key_env=api_key_env, sampling=sampling,
        budget=Budget(wall_s=budget_min * 60, n_submissions=submissions, max_turns=max_turns, max_tokens=max_tokens),
        command=command_line(ctx))
    protocol.model_config(request.model, request.base_url, request.api_key_env, sampling)  # fails before any file
    skill_text = _skill_text(skill)
    check_sandbox(settings.sandbox, allow_unsafe=settings.unsafe_sandbox, image=settings.image)
    require_writable_home(settings, "an attempt keeps its workspace there")
    spec = TrialSpec(problem=info, replicate=1, arm=arm_for(Dsl(dsl), skill_text is not None))
    with Store(settings.db_path) as store:
        console.print(f"{spec.trial_id} with {model_spec}: sandbox {settings.sandbox}, judge on {settings.device}, "
                      f"db {settings.db_path}")
        protocol.execute(settings, store, request, [PlanItem(spec=spec, action=Action.RUN, reason="mkb attempt")],
                         given_skills={spec.trial_id: skill_text} if skill_text is not None else None)
        trial = store.trial(model_spec, spec.trial_id)
        emit([_summary(trial, store.find_attempt(trial.attempt_id))], json_, csv_, title="attempt")
    exit_on_infra_errors(infra_failed(trial), "trial")


@click.command(name="replay")
@click.argument("trial_or_attempt")
@db_option
@run_options
@output_options
@click.pass_context
def replay(ctx, trial_or_attempt, device, sandbox, image, json_=False, csv_=False):
    """Re-run a recorded attempt's tool calls in a fresh workspace, without a model, and re-grade.

    The replay is stored as a new attempt of the same trial; the table compares each grading.

    Example:

    \b
        mkb replay p28_r1_solo_cutedsl --device cuda --json
    """
    from mkb.agent.sandboxes import check_sandbox
    from mkb.protocol.replay import replay as replay_attempt
    from mkb.store import Store

    settings = settings_from(ctx, device=device, sandbox=sandbox, image=image)
    check_sandbox(settings.sandbox, allow_unsafe=settings.unsafe_sandbox, image=settings.image)
    require_writable_home(settings, "a replay keeps its workspace there")
    with Store(settings.db_path) as store:
        original, replayed = replay_attempt(store, settings, trial_or_attempt, command=command_line(ctx))
        before = {s.n: s for s in store.submissions(original.attempt_id)}
        after = store.submissions(replayed.attempt_id)
    rows = [{"n": s.n, "kind": s.kind, "recorded_status": before[s.n].status if s.n in before else None,
             "recorded_speedup": before[s.n].speedup if s.n in before else None, "replay_status": s.status,
             "replay_speedup": s.speedup,
             "same_kernel": s.n in before and before[s.n].kernel_sha256 == s.kernel_sha256} for s in after]
    console.print(f"replay of {original.attempt_id} stored as attempt {replayed.attempt_id}")
    emit(rows, json_, csv_, title=f"replay of {original.trial_id}",
         columns=["n", "kind", "recorded_status", "recorded_speedup", "replay_status", "replay_speedup", "same_kernel"])
    exit_on_infra_errors(infra_failed(replayed), "replay")


def register(main: click.Group) -> None:
    main.add_command(attempt)
    main.add_command(replay)
