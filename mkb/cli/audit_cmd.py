"""`mkb audit`: re-check a results database's final gradings with the judge's current rules."""

from __future__ import annotations

import json

import click

from mkb.cli import console, db_option, emit, settings_from


@click.command(name="audit")
@db_option
@click.option("--all", "all_", is_flag=True, help="List every final grading, not only those that would now fail "
                                                  "or need a new grading.")
@click.option("--json", "json_", is_flag=True, help="Print the rows as JSON on stdout.")
@click.pass_context
def audit_cmd(ctx, all_, json_):
    """Re-scan every stored final kernel with the current static rules and re-score its grading under the strict
    DSL policy; list the trials that would now fail (and those that need a new grading to tell).

    Example:

    \b
        mkb audit --db results/mkb.duckdb
        mkb audit --all --json > audit.json
    """
    from mkb.audit import as_dicts, audit
    from mkb.problems import catalog_for
    from mkb.store import Store

    settings = settings_from(ctx)
    with Store(settings.db_path, read_only=True) as store:
        rows = audit(store, catalog_for(settings.problems_dir))
    shown = rows if all_ else [r for r in rows if r.verdict != "ok"]
    failing = sum(r.verdict == "would fail" for r in rows)
    regrade = sum(r.verdict == "regrade" for r in rows)
    if json_:
        click.echo(json.dumps(as_dicts(shown), indent=2))
    else:
        table = [{**r, "static": "; ".join(r["static"])[:80], "dsl_share": r["dsl_share"]} for r in as_dicts(shown)]
        emit(table, title=f"{settings.db_path}: final gradings re-checked",
             columns=["model", "trial_id", "status", "verdict", "static", "dsl_share", "share_from", "share_min",
                      "strict", "knockout"])
    console.print(f"{len(rows)} final gradings: {failing} would now fail, {regrade} need a new grading to tell, "
                  f"{len(rows) - failing - regrade} ok.")


def register(main: click.Group) -> None:
    main.add_command(audit_cmd)
