"""The mkb command line: one module per command group, each registering itself on `main`."""

from __future__ import annotations

import errno
import importlib
import json
import logging
import pkgutil
import shlex
import sys
import tempfile
from pathlib import Path

import click
from rich.console import Console
from rich.logging import RichHandler

from mkb.errors import MkbError
from mkb.settings import Settings, load_settings

console = Console(stderr=True)

EXIT_INFRA_ERROR = 3
"""Exit status of a command that ran but whose trials or grading ended in infra_error (provider or judge
failed; nothing charged to the model): running the same command again retries them."""


def infra_failed(row) -> bool:
    """A trial or attempt row that the infrastructure failed: its state, or its final grading's status."""
    return "infra_error" in (row.state, row.status)


def exit_on_infra_errors(n: int | bool, noun: str) -> None:
    """The one exit rule for infra_error (run-model, attempt, replay, verify): say so and exit 3 when n > 0."""
    if n:
        console.print(f"{int(n)} {noun}{'s' if n > 1 else ''} ended in infra_error (the provider or the judge "
                      f"failed; not charged to the model): run the same command again to retry, exit status "
                      f"{EXIT_INFRA_ERROR}")
        sys.exit(EXIT_INFRA_ERROR)


def _take_db(ctx: click.Context, param, value):
    if value is not None:
        root = ctx.find_root()
        given = (root.obj or {}).get("db")
        if given is not None and Path(given) != Path(value):
            raise click.UsageError(f"--db is given twice ({given} and {value}); give it once.")
        root.obj = {**(root.obj or {}), "db": value}
    return value


def db_option(fn):
    """--db on a command that opens the database: the same setting as `mkb --db PATH` before the command."""
    return click.option("--db", type=click.Path(dir_okay=False), expose_value=False, callback=_take_db,
                        help="Results database (default <home>/mkb.duckdb; env MKB_DB); also accepted "
                             "before the command.")(fn)


def comma_separated(choices: list[str] | None = None):
    """An option callback: values repeated or comma-separated (a,b), each checked against choices if given."""

    def split(ctx: click.Context, param, value) -> tuple[str, ...]:
        items = tuple(x.strip() for v in value or () for x in v.split(",") if x.strip())
        bad = [x for x in items if choices is not None and x not in choices]
        if bad:
            raise click.BadParameter(f"'{bad[0]}' is not one of {', '.join(choices)}.")
        return items

    return split


def require_writable(directory: Path, why: str, fix: str) -> None:
    """Fail in one line, before anything runs, when directory cannot be created or written."""
    if directory.exists() and not directory.is_dir():
        raise MkbError(f"{directory} is a file, and {why}. {fix}")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=directory).close()
    except OSError as exc:
        raise MkbError(f"{directory} is not writable ({exc.strerror or exc}), and {why}. {fix}") from None


def require_writable_home(settings: Settings, why: str) -> None:
    """require_writable for MKB_HOME, which holds workspaces and reports."""
    require_writable(settings.home, why, "Set MKB_HOME (or --home) to a writable directory.")


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


def protocol_options(fn):
    """--clock, --context-full and --examples/--no-examples: where ours differs from the paper's protocol
    (settings; the paper's behaviour is each default, docs/fidelity.md)."""
    fn = click.option("--examples/--no-examples", "manual_examples", default=None,
                      help="Give agents the manuals' worked example kernels (default: the manual_examples "
                           "setting, on).")(fn)
    fn = click.option("--context-full", type=click.Choice(["summarize", "end"]),
                      help="When the context is full: summarize and go on (the paper's agent), or end the attempt "
                           "(default: the context_full setting, summarize).")(fn)
    return click.option("--clock", type=click.Choice(["paper", "agent"]),
                        help="Budget clock: paper (everything counts, judge queue and grading included) or agent "
                             "(GPU queue and provider backoff paused) (default: the clock setting, paper).")(fn)


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
        except OSError as exc:  # a path the user chose that cannot be written: a fix, not a traceback
            if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM) or exc.filename is None:
                raise
            raise click.ClickException(f"{exc.filename}: {exc.strerror}. Choose a writable path (--db, --out, "
                                       f"--parquet; --home or MKB_HOME holds all mutable state), or make it "
                                       f"writable.") from None
        except KeyboardInterrupt:
            console.print("interrupted")
            sys.exit(130)


@click.group(cls=MkbGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--db", type=click.Path(dir_okay=False), help="Results database (default <home>/mkb.duckdb; env MKB_DB); "
              "also accepted after any command that opens it.")
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
