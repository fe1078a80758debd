"""`mkb calibrate` and `mkb regrade`: the final-grading mode's noise floors, and old results graded again in it."""

from __future__ import annotations

import click

from mkb.cli import (command_line, comma_separated, console, db_option, emit, exit_on_infra_errors, output_options,
                     settings_from)
from mkb.errors import MkbError
from mkb.judge.robust import SUMMARIES
from mkb.records import DSLS

CALIBRATE_COLUMNS = ["problem", "dsl", "passed", "kernel_ms", "speedup_median", "spread_pct", "spread_met", "final_s",
                     "added_s", "added_met", "floor_stored"]
REGRADE_COLUMNS = ["model", "trial", "applied", "status_before", "status_after", "speedup_before", "speedup_after",
                   "grading_before", "grading_after"]


def final_options(fn):
    """--processes, --summary and --timing: how a final grading is made."""
    fn = click.option("--timing", type=click.Choice(["paper", "flushed"]), default="paper", show_default=True,
                      help="Timing mode of the gradings.")(fn)
    fn = click.option("--summary", type=click.Choice(SUMMARIES), default=None,
                      help="How a final grading summarises its processes (default: the judge_final_summary "
                           "setting, min).")(fn)
    return click.option("--processes", type=click.IntRange(1), default=None,
                        help="Fresh processes per final grading (default: the judge_final_processes setting, 5).")(fn)


def _judging(ctx, device, timing, processes, summary, store):
    from mkb.environment import resolve_device
    from mkb.protocol.judging import Judging

    settings = settings_from(ctx, device=device, judge_spares=1)
    return settings, Judging(settings, resolve_device(settings), store, timing=timing, processes=processes,
                             summary=summary)


@click.command(name="calibrate")
@click.argument("variants", nargs=-1)
@click.option("--dsl", "dsls", multiple=True, callback=comma_separated([str(d) for d in DSLS]),
              help="DSLs of the variants that name none, repeated or comma-separated (default both).")
@click.option("--repeats", type=click.IntRange(2), default=3, show_default=True, help="Final gradings per variant.")
@final_options
@db_option
@output_options
@click.pass_context
def calibrate(ctx, variants, dsls, repeats, processes, summary, timing, json_=False, csv_=False):
    """Grade kernels REPEATS times in the final-grading mode; store each variant's spread as its noise floor.

    VARIANTS are p25 (both shipped solutions), p25:cutedsl or p25:cutedsl:path/kernel.py; none means every
    shipped solution. The spread is max/min - 1 of a variant's speedups; the report compares paired ratios
    with max(delta, the problem's floor) beside the paper's delta. A variant not passed every time stores
    no floor. Each row also checks issue #27's goals (spread <= 2 % for kernels >= 50 us, <= 5 % for all;
    a final grading of a kernel <= 1 ms adds <= 30 s). Needs a GPU.

    Example:

    \b
        mkb calibrate p25:cutedsl p19:tirx p01:tirx p28:cutedsl --repeats 3 --json
    """
    from mkb.judge import prepare_host
    from mkb.protocol import calibrate as calibration
    from mkb.store import Store

    settings = settings_from(ctx)
    found = calibration.variants(settings, list(variants), list(dsls))
    if not found:
        raise MkbError("nothing to calibrate: no shipped solutions found. Name variants, e.g. p28:tirx:kernel.py.")
    prepare_host()
    rows = []
    with Store(settings.db_path) as store:
        settings, judging = _judging(ctx, None, timing, processes, summary, store)
        if judging.device.kind != "cuda":
            raise MkbError("mkb calibrate times kernels and needs a CUDA GPU; none is visible here.")
        slot = judging.device.slots[0]
        for variant in found:
            console.print(f"calibrating {variant.problem.id} {variant.dsl}: {repeats} final gradings")
            records = calibration.repeat(judging, variant, repeats, slot)
            row = calibration.summarize(variant, records)
            floor = calibration.floor(variant, records, judging.gpu(slot), timing)
            if floor is not None:
                store.put(floor)
            rows.append(row | {"floor_stored": floor is not None})
    emit(rows, json_, csv_, title="calibration (final-grading mode)", columns=CALIBRATE_COLUMNS)


@click.command(name="regrade")
@click.option("--models", multiple=True, callback=comma_separated(),
              help="Models whose trials to regrade, comma-separated or repeated (default all).")
@click.option("--problems", multiple=True, callback=comma_separated(),
              help="Problem ids, comma-separated or repeated (default all).")
@final_options
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default=None,
              help="Where the judge runs (default: the device setting; cpu grades at smoke scale, for tests).")
@click.option("--dry-run", is_flag=True, help="List the trials that would be regraded and stop.")
@db_option
@output_options
@click.pass_context
def regrade(ctx, models, problems, processes, summary, timing, device, dry_run, json_=False, csv_=False):
    """Grade the final kernels of finished trials again in the final-grading mode; no agent runs again.

    Each trial's last final kernel is graded in several fresh processes against the stored eager baseline;
    the new grading is added to its attempt as a later final grading (the earlier one stays) and the trial
    takes its result, unless it ended in infra_error. `mkb report` then rebuilds Table 1 from it. Work on a
    copy of a database you want to keep as it was.

    Example:

    \b
        cp artifact/results/mkb-h200.duckdb /tmp/regraded.duckdb
        mkb regrade --db /tmp/regraded.duckdb --models reference --problems p19,p25 --json
    """
    from mkb.judge import prepare_host
    from mkb.problems import catalog_for, resolve
    from mkb.protocol import regrade as regrading
    from mkb.store import Store

    base = settings_from(ctx)
    names = list(models) or None
    catalog = catalog_for(base.problems_dir)
    ids = [resolve(n, catalog).id for n in problems] or None
    if dry_run:  # read-only: a dry run never migrates or writes the file
        with Store(base.db_path, read_only=True) as store:
            chosen = regrading.targets(store, names, ids)
        emit([{"model": t.model, "trial": t.trial_id, "status": str(t.status), "speedup": t.speedup,
               "final_submission": s.n} for t, s in chosen], json_, csv_, title=f"{len(chosen)} trials to regrade")
        return
    with Store(base.db_path) as store:
        prepare_host()
        settings, judging = _judging(ctx, device, timing, processes, summary, store)
        slot = judging.device.slots[0]
        params = {"processes": judging.processes or settings.judge_final_processes,
                  "summary": judging.summary or settings.judge_final_summary, "timing": timing,
                  "device": judging.device.kind, "gpus": judging.device.gpus}

        def show(done) -> None:
            console.print(f"{done.trial_id} ({done.model}): {done.before['status']} {done.before['speedup']} -> "
                          f"{done.after['status']} {done.after['speedup']}{'' if done.applied else ' (not applied)'}")

        done = regrading.regrade(settings, store, lambda p, path, dsl: judging.final(p, path, dsl, device_slot=slot),
                                 names, ids, params, command_line(ctx), on_trial=show)
    emit([d.row() for d in done], json_, csv_, title=f"{len(done)} trials regraded", columns=REGRADE_COLUMNS)
    exit_on_infra_errors(sum(str(d.after["status"]) == "infra_error" for d in done), "regrading")


def register(main):
    main.add_command(calibrate)
    main.add_command(regrade)
