"""`mkb run-model`: the whole protocol for one model (or the `reference` oracle)."""

from __future__ import annotations

import time

import click

from mkb.cli import (command_line, comma_separated, console, db_option, emit, exit_on_infra_errors, infra_failed,
                     protocol_options, require_writable_home, run_options, settings_from)
from mkb.records import FAMILIES, Arm


class _Live:
    """The progress view: a rich Live table on a terminal, plain log lines otherwise."""

    def __init__(self):
        self.pool = None
        self.started = time.monotonic()
        self.live = None
        if console.is_terminal:
            from rich.live import Live

            self.live = Live(console=console, refresh_per_second=2, transient=False)

    def __enter__(self):
        if self.live:
            self.live.__enter__()
        return self

    def __exit__(self, *exc):
        if self.live:
            self.live.__exit__(*exc)

    def event(self, kind, spec, progress):
        if self.live is None:
            console.print(f"[{time.monotonic() - self.started:7.0f}s] {kind:5} {spec.trial_id} "
                          f"({progress.done}/{progress.total} done, {progress.passed} passed)")
            return
        from rich.table import Table

        table = Table(title=f"{progress.done}/{progress.total} trials done, {progress.passed} passed, "
                            f"{len(progress.running)} running, GPU queue {self.pool.queued if self.pool else 0}, "
                            f"tokens {progress.prompt_tokens + progress.completion_tokens:,}, "
                            f"cost ${progress.cost_usd:.2f}")
        table.add_column("running trial")
        table.add_column("elapsed")
        for trial, since in sorted(progress.running.items()):
            table.add_row(trial, f"{time.monotonic() - since:.0f}s")
        self.live.update(table)


@click.command(name="run-model")
@click.argument("model")
@click.option("--problems", "problems", multiple=True, callback=comma_separated(),
              help="Problem ids or globs, repeated or comma-separated (e.g. 'p0[1-9]*'); default all.")
@click.option("--families", multiple=True, callback=comma_separated(list(FAMILIES)),
              help=f"Only these families, repeated or comma-separated: {', '.join(FAMILIES)}.")
@click.option("--arms", multiple=True, callback=comma_separated([str(a) for a in Arm]),
              help=f"Arms, repeated or comma-separated (default all four): {', '.join(str(a) for a in Arm)}.")
@click.option("--trials", "trial_glob", help="Only trial ids matching this glob (sources pulled in).")
@click.option("--replicates", default=1, show_default=True, type=click.IntRange(1), help="Replicates per arm.")
@click.option("--concurrency", default=4, show_default=True, type=click.IntRange(1), help="Attempts at once.")
@click.option("--gpus", help="GPU indices for judge workers, e.g. 0,1,2 (default: every visible GPU).")
@run_options
@protocol_options
@click.option("--rerun-stale", is_flag=True, help="Rerun finished trials whose fingerprint changed.")
@click.option("--dry-run", is_flag=True, help="Print the plan and change nothing.")
@click.option("--base-url", help="OpenAI-compatible endpoint for plain model names (env MKB_BASE_URL).")
@click.option("--api-key-env", help="Environment variable holding the API key.")
@click.option("--budget-s", type=float, default=2400.0, show_default=True, help="Wall clock per attempt (see --clock).")
@click.option("--submissions", type=int, default=10, show_default=True, help="Feedback submissions per attempt.")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="Run on this host, or attempts as Ray tasks and judges as one-GPU Ray actors (docs/ray.md).")
@click.option("--ray-address", help="Ray cluster for --executor ray (auto, HOST:6379, ray://HOST:10001); "
                                    "default: the one 'ray start' left on this host, else a new local one.")
@db_option
@click.pass_context
def run_model_cmd(ctx, model, problems, families, arms, trial_glob, replicates, concurrency, gpus, device, sandbox,
                  image, clock, context_full, manual_examples, rerun_stale, dry_run, base_url, api_key_env, budget_s,
                  submissions, executor, ray_address):
    """Run the protocol for MODEL (provider/model, a plain name with --base-url, or `reference`).

    Trials are p<NN>_r<k>_<arm>; finished ones are reused, errored ones rerun, stale ones block
    unless --rerun-stale. `reference` is an offline oracle that submits the shipped solutions.
    Exits 3 when trials end in infra_error (provider or judge failed; not charged): run it again to retry them.

    Example:

    \b
        mkb run-model reference --problems 'p0[1-9]*' --dry-run
        mkb run-model openrouter/qwen/qwen3-coder --replicates 2 --concurrency 8
        mkb run-model reference --executor ray --ray-address auto --concurrency 64
    """
    from mkb import protocol
    from mkb.agent.budget import Budget
    from mkb.agent.model import parse_model_spec
    from mkb.protocol.plan import Action
    from mkb.store import Store

    settings = settings_from(ctx, base_url=base_url, device=device, sandbox=sandbox, image=image, clock=clock,
                             context_full=context_full, manual_examples=manual_examples)
    if dry_run:  # a bad model name fails before the plan; a dry run needs no key to look
        if model != protocol.ORACLE:
            parse_model_spec(model, settings.base_url, api_key_env)
    else:
        protocol.model_config(model, settings.base_url, api_key_env, None)
        require_writable_home(settings, "runs keep the attempts' workspaces there")
        from mkb.judge import prepare_host  # a dead run's judge leftovers go; SIGTERM cleans up

        prepare_host()
    request = protocol.RunRequest(
        model=model, problems=list(problems) or None, families=list(families) or None,
        arms=[Arm(a) for a in arms] or None, trial_glob=trial_glob, replicates=replicates,
        concurrency=concurrency, slots=gpus.split(",") if gpus else None, rerun_stale=rerun_stale,
        budget=Budget(wall_s=budget_s, n_submissions=submissions), base_url=settings.base_url,
        api_key_env=api_key_env, command=command_line(ctx))
    if dry_run:  # changes nothing: not even creating the database file
        opened = Store(settings.db_path, read_only=True) if settings.db_path.exists() else Store(":memory:")
    else:
        opened = Store(settings.db_path)
    with opened as store:
        items = protocol.make_plan(settings, store, request)
        counts = {a: sum(i.action == a for i in items) for a in Action}
        console.print("plan: " + ", ".join(f"{n} {a}" for a, n in counts.items()) + f" ({len(items)} trials)")
        if dry_run:
            emit([{"trial": i.spec.trial_id, "action": str(i.action), "reason": i.reason} for i in items
                  if i.action != Action.REUSE], title=f"trials to run for {model}",
                 columns=["trial", "action", "reason"])
            return
        items = protocol.check_stale(items, rerun_stale)
        view = _Live()
        started = time.monotonic()
        ray = None
        if executor == "ray":  # then the cluster's GPUs count, not this host's
            from mkb.protocol.ray_executor import RayOptions

            ray = RayOptions(address=ray_address)
        with view:
            progress = protocol.execute(settings, store, request, items, ray=ray, on_event=view.event,
                                        on_pool=lambda p: setattr(view, "pool", p))
        wall = time.monotonic() - started
        rows = store.rows("SELECT state, status, count(*) AS n FROM trials WHERE model = ? "
                          "GROUP BY ALL ORDER BY ALL", [model])
        ran = {i.spec.trial_id for i in items if i.action != Action.REUSE}
        infra = sum(t.trial_id in ran and infra_failed(t) for t in store.trials(model))
    emit(rows, title=f"{model}: {progress.done} trials run in {wall:.0f} s "
                     f"({3600 * progress.done / max(wall, 1e-9):.1f} trials/hour)")
    console.print(f"Results in {settings.db_path}")
    exit_on_infra_errors(infra, "trial")


def register(main: click.Group) -> None:
    main.add_command(run_model_cmd)
