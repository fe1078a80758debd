"""`mkb verify`: grade one kernel file against one problem variant with the judge."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import click

from mkb.cli import console, db_option, dsl_policy_option, exit_on_infra_errors, settings_from
from mkb.records import DSLS, Status


@click.command(name="verify")
@click.argument("problem_id")
@click.argument("kernel", type=click.Path(dir_okay=False))
@click.option("--dsl", type=click.Choice([str(d) for d in DSLS]), required=True, help="Declared DSL of the kernel.")
@click.option("--device", type=click.Choice(["cuda", "cpu", "auto"]), default=None,
              help="Where the kernel runs (default: the device setting, auto = cuda when present).")
@click.option("--json", "json_", is_flag=True, help="Print the judge record as one JSON object on stdout.")
@click.option("--timing", type=click.Choice(["paper", "flushed"]), default="paper", show_default=True,
              help="paper: warm L2 as in the paper; flushed: L2 evicted before each timed call.")
@click.option("--timeout", "timeout_s", type=float, default=None, help="Hard limit in seconds (default: the setting).")
@click.option("--scale", type=click.Choice(["full", "smoke"]), default="full", show_default=True,
              help="Problem size: smoke is the tiny CPU-test workload.")
@click.option("--final", is_flag=True,
              help="Grade as an attempt's result is graded: in several fresh processes, against the eager baseline "
                   "stored in --db when there is one (and storing the one it measures there).")
@click.option("--processes", type=click.IntRange(1), default=None,
              help="With --final: fresh processes (default: the judge_final_processes setting, 5).")
@db_option
@dsl_policy_option
@click.pass_context
def verify(ctx, problem_id, kernel, dsl, device, json_, timing, timeout_s, scale, final, processes):
    """Grade KERNEL (a kernel.py defining solve) on PROBLEM_ID; exit 0 when it passed, 3 on infra_error, else 1.

    With --db (or MKB_DB) the judge record is also stored in that database.

    Example:

    \b
        mkb verify p28 --dsl cutedsl kernel.py --json
        mkb verify p28 --dsl tirx kernel.py --device cpu --scale smoke
        mkb verify p28 --dsl cutedsl kernel.py --final --db results/mkb.duckdb
        mkb verify p28 --dsl cutedsl kernel.py --dsl-policy strict
    """
    from mkb.judge import prepare_host
    from mkb.problems import catalog_for, resolve

    # one grading: nothing to start ahead; a final grading's next processes start while one runs
    settings = settings_from(ctx, judge_spares=1 if final else 0, device=device)
    prepare_host()
    problem = resolve(problem_id, catalog_for(settings.problems_dir))
    store = None
    if settings.db is not None:  # --db, the global --db or MKB_DB: store the record there
        from mkb.store import Store

        store = Store(settings.db_path)
    try:
        record = _grade(settings, store, problem, kernel, dsl, timing, timeout_s, scale, final, processes)
        if store is not None:
            store.add_evaluation(record, origin="verify --final" if final else "verify",
                                 kernel_path=str(Path(kernel).resolve()),
                                 kernel_sha256=hashlib.sha256(Path(kernel).read_bytes()).hexdigest())
    finally:
        if store is not None:
            store.close()
    if json_:
        click.echo(json.dumps(record.model_dump(mode="json"), allow_nan=False))
    else:
        _show(record)
    exit_on_infra_errors(record.status == Status.INFRA_ERROR, "grading")
    sys.exit(0 if record.passed else 1)


def _grade(settings, store, problem, kernel, dsl, timing, timeout_s, scale, final, processes):
    """One grading, or a final grading in `processes` fresh processes (None: the setting's number)."""
    from mkb.environment import resolve_device
    from mkb.protocol.judging import ANY, Judging

    judging = Judging(settings, resolve_device(settings), store, timing=timing, processes=processes, scale=scale,
                      timeout_s=timeout_s)
    if not final:
        return judging.feedback(problem, kernel, dsl, device_slot=ANY)
    return judging.final(problem, kernel, dsl, device_slot=ANY)


def _show(record) -> None:
    colour = "green" if record.passed else "red"
    console.print(f"[{colour}]{record.status}[/{colour}] {record.problem} ({record.dsl}, {record.device}): "
                  f"{record.message}")
    if record.kernel_ms is not None:
        console.print(f"kernel {record.kernel_ms:.4f} ms, eager {record.eager_ms:.4f} ms, "
                      f"speedup {record.speedup:.3f}x")
    console.print(f"DSL check: {record.dsl_check}; {len(record.draws)} draws; {record.wall_s:.1f} s")


def register(main):
    main.add_command(verify)
