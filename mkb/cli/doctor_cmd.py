"""`mkb doctor`: check GPU, driver, CUDA, both DSLs, torch, database, sandbox and model endpoint."""

from __future__ import annotations

import sys

import click

from mkb.cli import db_option, emit, output_options, settings_from


@click.command(name="doctor")
@click.option("--base-url", help="Also check this OpenAI-compatible endpoint (default MKB_BASE_URL).")
@db_option
@output_options
@click.pass_context
def doctor_cmd(ctx, base_url, json_=False, csv_=False):
    """Check that this machine can run MKB: one line per component, with the fix for each failure.

    Exits 1 when a component fails (a missing GPU is a warning: CPU mode still works).

    Example:

    \b
        mkb doctor
        mkb doctor --base-url http://127.0.0.1:8000/v1 --json
    """
    from mkb.doctor import diagnose

    findings = diagnose(settings_from(ctx), base_url)
    emit([f.__dict__ for f in findings], json_, csv_, title="mkb doctor",
         columns=["component", "state", "detail", "fix"])
    if any(f.state == "fail" for f in findings):
        sys.exit(1)


def register(main: click.Group) -> None:
    main.add_command(doctor_cmd)
