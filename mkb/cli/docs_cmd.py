"""`mkb docs`: build the agents' API reference from the installed DSLs; keep the manuals' size tables current."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from mkb.cli import comma_separated, console, emit, output_options, settings_from
from mkb.records import DSLS


@click.group(name="docs")
def docs():
    """The DSL manuals agents read (problems/docs/<dsl>/).

    Example:

    \b
        mkb docs build
        mkb docs tables --check
    """


@docs.command(name="build")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Write DIR/<dsl>/ instead of problems/docs/<dsl>/api/.")
@click.option("--dsl", "dsls", multiple=True, callback=comma_separated([str(d) for d in DSLS]),
              help=f"Only these DSLs: {', '.join(str(d) for d in DSLS)} (repeated or comma-separated; default both).")
@output_options
@click.pass_context
def docs_build(ctx, out, dsls=(), json_=False, csv_=False):
    """Generate the API reference of each DSL from the installed packages (one entry per public API).

    Run at install and image-build time; the output is git-ignored (it carries upstream docstrings).

    Example:

    \b
        mkb docs build
        mkb docs build --dsl tirx --out /tmp/api
    """
    from mkb import docs as docs_mod

    settings = settings_from(ctx)
    chosen = list(dsls) or [str(d) for d in DSLS]
    targets = {d: (out / d if out else settings.problems_dir / "docs" / d / "api") for d in chosen}
    reports = docs_mod.build(targets)
    rows = [{"dsl": r.dsl, "pages": len(r.pages), "entries": r.n_entries, "skipped": len(r.skipped),
             "seconds": r.seconds, "out_dir": r.out_dir} for r in reports]
    emit(rows, json_, csv_, title="mkb docs build")
    for r in reports:
        for module, why in r.skipped:
            console.print(f"[yellow]{r.dsl}: skipped {module}[/yellow] ({why})")


@docs.command(name="tables")
@click.option("--check", is_flag=True, help="Only check; exit 1 when a generated table is out of date.")
@click.pass_context
def docs_tables(ctx, check):
    """Rewrite the generated size/coverage tables (docs/manuals.md, the guide tables in each INDEX.md).

    Example:

    \b
        mkb docs tables
        mkb docs tables --check
    """
    from mkb import manuals

    settings = settings_from(ctx)
    stale = manuals.sync_tables(settings.problems_dir, Path(settings.problems_dir).parent / "docs", write=not check)
    for path in stale:
        console.print(f"{'out of date' if check else 'rewrote'}: {path}")
    if check and stale:
        sys.exit(1)


def register(main: click.Group) -> None:
    main.add_command(docs)
