"""The mkb command line: one module per command group, each registering itself on `main`."""

from __future__ import annotations

import importlib
import json
import logging
import pkgutil
import shlex
import sys
from functools import wraps

import click
from rich.console import Console
from rich.logging import RichHandler

from mkb.errors import MkbError
from mkb.settings import Settings, load_settings

console = Console(stderr=True)


def output_options(fn):
    """Add --json and --csv: data goes to stdout in that format instead of a table on stderr."""
    fn = click.option("--csv", "csv_", is_flag=True, help="Print CSV on stdout.")(fn)
    fn = click.option("--json", "json_", is_flag=True, help="Print JSON on stdout.")(fn)
    return fn


def emit(rows: list[dict], json_: bool = False, csv_: bool = False, title: str | None = None,
         columns: list[str] | None = None) -> None:
    """Print rows as JSON or CSV on stdout, or as a rich table on stderr."""
    columns = columns or (list(rows[0]) if rows else [])
    if json_:
        click.echo(json.dumps(rows, indent=2, default=str))
    elif csv_:
        import csv

        writer = csv.DictWriter(sys.stdout, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    else:
        from rich.table import Table

        table = Table(title=title)
        for col in columns:
            table.add_column(col)
        for row in rows:
            table.add_row(*[_cell(row.get(c)) for c in columns])
        console.print(table)


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def dsl_policy_option(fn):
    """--dsl-policy paper|strict: recorded in the invocation's settings (no parameter of its own)."""

    def remember(ctx: click.Context, _param, value):
        if value is not None:
            ctx.find_root().obj = {**(ctx.find_root().obj or {}), "dsl_policy": value}

    return click.option("--dsl-policy", type=click.Choice(["paper", "strict"]), expose_value=False, callback=remember,
                        help="DSL-use policy: paper (as the original: the DSL runs and computes the answer; its share "
                             "of device time is recorded) or strict (the share must also reach 0.9, or the problem's "
                             "DSL_SHARE) (default: the dsl_policy setting, paper).")(fn)


def run_options(fn):
    """--device, --sandbox, --image and --dsl-policy: where an attempt's kernels are graded and its commands run, and
    the DSL-use policy they are graded under (settings)."""
    fn = dsl_policy_option(fn)
    fn = click.option("--image", help="Image for --sandbox docker (default: the image setting, mkb:latest).")(fn)
    fn = click.option("--sandbox", type=click.Choice(["local", "docker", "none"]),
                      help="Where the agent's commands run: local (bubblewrap; refused where it cannot run, unless "
                           "MKB_UNSAFE_SANDBOX=1), docker (a container of --image) or none (no isolation: needs "
                           "MKB_UNSAFE_SANDBOX=1) (default: the sandbox setting).")(fn)
    return click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]),
                        help="Where the judge runs kernels; cpu grades at smoke scale, for tests "
                             "(default: the device setting, auto).")(fn)


def command_line(ctx: click.Context) -> str:
    """The command line of this invocation, as run rows record it."""
    return shlex.join(["mkb", *ctx.find_root().meta.get("argv", [])])


def settings_from(ctx: click.Context, **overrides) -> Settings:
    """Settings for this invocation, built once: command flags > global flags > MKB_* env > defaults."""
    base = dict(ctx.find_root().obj or {})
    base.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return load_settings(**base)
    except ValueError as exc:
        raise MkbError(f"invalid setting: {exc}") from None


class MkbGroup(click.Group):
    """Turns MkbError into one 'Error: ...' line (exit 1) and Ctrl-C into exit 130; keeps the arguments."""

    def parse_args(self, ctx, args):
        ctx.meta["argv"] = list(args)
        return super().parse_args(ctx, args)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except MkbError as exc:
            raise click.ClickException(str(exc)) from None
        except KeyboardInterrupt:
            console.print("interrupted")
            sys.exit(130)


@click.group(cls=MkbGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--db", type=click.Path(dir_okay=False), help="Results database (default <home>/mkb.duckdb; env MKB_DB).")
@click.option("--home", type=click.Path(file_okay=False), help="Directory for all mutable state (env MKB_HOME).")
@click.option("-v", "--verbose", is_flag=True, help="Show debug logging.")
@click.option("-q", "--quiet", is_flag=True, help="Show warnings and errors only.")
@click.version_option(package_name="mkb")
@click.pass_context
def main(ctx, db, home, verbose, quiet):
    """MetaKernelBench: does a skill learned in one kernel DSL help in another?

    Example:

    \b
        mkb problems list
        mkb verify p28 --dsl cutedsl kernel.py --json
    """
    level = logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO
    logging.basicConfig(level=level, format="%(message)s", handlers=[RichHandler(console=console, show_path=False)],
                        force=True)
    ctx.obj = {"db": db, "home": home}


def _register_commands() -> None:
    package = sys.modules[__name__]
    for module in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        mod = importlib.import_module(f"{__name__}.{module.name}")
        if hasattr(mod, "register"):
            mod.register(main)


_register_commands()
