"""`mkb reproduce`: the main job behind `make reproduce`."""

from __future__ import annotations

import sys

import click

from mkb.cli import console, emit, settings_from


@click.command(name="reproduce")
@click.pass_context
def reproduce_cmd(ctx):
    """Run every reproduction step this machine can, record it in the database, print a summary.

    Without a GPU it validates the problem set at smoke scale on the CPU and says what it skipped;
    with a GPU it also checks every problem at full scale.

    Example:

    \b
        mkb reproduce
    """
    from mkb.reproduce import reproduce

    settings = settings_from(ctx)
    result = reproduce(settings)
    console.print(f"GPU: {result.gpu or 'none visible (CPU-only steps)'}")
    emit([{"step": s.name, "result": "skipped" if s.skipped else "ok" if s.ok else "FAILED", "summary": s.summary}
          for s in result.steps], title="mkb reproduce")
    console.print(f"Results recorded in {settings.db_path} (query with: mkb db query \"SELECT * FROM problem_checks\")")
    if not result.ok:
        sys.exit(1)


def register(main: click.Group) -> None:
    main.add_command(reproduce_cmd)
