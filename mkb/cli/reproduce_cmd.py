"""`mkb reproduce`: the main job behind `make reproduce`."""

from __future__ import annotations

import sys

import click

from mkb.cli import console, db_option, emit, require_writable_home, settings_from


@click.command(name="reproduce")
@click.option("--model", help="Run this model's full protocol (provider/model) instead of the oracle.")
@click.option("--base-url", help="Endpoint for a plain model name (env MKB_BASE_URL).")
@click.option("--problems", help="Only these problems in the protocol run (ids or globs, "
              "comma-separated, e.g. 'p28,p25'); finished trials in the database are reused. QA covers all.")
@db_option
@click.pass_context
def reproduce_cmd(ctx, model, base_url, problems):
    """Run every reproduction step this machine can, record it in the database, print a summary.

    On a GPU: problem QA (smoke and full scale), the `reference` oracle protocol, report and claims.
    With MODEL: that model's protocol. Without a GPU: smoke QA, then every table regenerated from the
    shipped H200 results and compared with the committed ones. It says what it skipped and why.

    Example:

    \b
        mkb reproduce
        mkb reproduce --problems p28,p25    # the oracle on a slice (one GPU session)
    """
    from mkb.reproduce import reproduce

    settings = settings_from(ctx, base_url=base_url)
    require_writable_home(settings, "reproduce keeps workspaces and reports there")
    result = reproduce(settings, model=model, problems=[p for p in (problems or "").split(",") if p] or None)
    console.print(f"GPU: {result.gpu or 'none visible (CPU-only steps)'}")
    emit([{"step": s.name, "result": "skipped" if s.skipped else "ok" if s.ok else "FAILED", "summary": s.summary}
          for s in result.steps], title="mkb reproduce")
    console.print(f"Recorded in {settings.db_path}; outputs: " + ", ".join(result.outputs or [str(settings.db_path)]))
    if not result.ok:
        sys.exit(1)


def register(main: click.Group) -> None:
    main.add_command(reproduce_cmd)
