"""`mkb db`: create, locate and query the results database."""

from __future__ import annotations

import click

from mkb.cli import console, db_option, emit, output_options, settings_from


@click.group(name="db")
@db_option
def db():
    """The DuckDB results file (default results/mkb.duckdb; --db or MKB_DB to change).

    Example:

    \b
        mkb db init
        mkb db query "SELECT family, count(*) FROM problems GROUP BY family" --json
    """


@db.command(name="init")
@db_option
@click.pass_context
def db_init(ctx):
    """Create (or migrate) the database and fill the problems table from the catalog.

    Example:

    \b
        mkb db init --db /tmp/x.duckdb
    """
    from mkb.problems import catalog_for
    from mkb.store import Store

    settings = settings_from(ctx)
    with Store(settings.db_path) as store:
        problems = catalog_for(settings.problems_dir)
        store.upsert_problems(problems)
        console.print(f"{settings.db_path}: schema version {store.schema_version}, {len(problems)} problems")
    click.echo(str(settings.db_path))


@db.command(name="path")
@db_option
@click.pass_context
def db_path(ctx):
    """Print the path of the results database in use.

    Example:

    \b
        MKB_DB=/tmp/x.duckdb mkb db path
    """
    click.echo(str(settings_from(ctx).db_path))


@db.command(name="query")
@click.argument("sql")
@db_option
@output_options
@click.pass_context
def db_query(ctx, sql, json_=False, csv_=False):
    """Run one SQL statement against the database (read-only) and print the rows.

    Example:

    \b
        mkb db query "SELECT * FROM trials WHERE status = 'passed'" --csv
    """
    from mkb.store import Store

    settings = settings_from(ctx)
    with Store(settings.db_path, read_only=True) as store:
        cols, rows = store.query(sql)
    emit([dict(zip(cols, r)) for r in rows], json_, csv_, columns=cols)


@click.command(name="settings")
@db_option
@output_options
@click.pass_context
def settings_cmd(ctx, json_=False, csv_=False):
    """Print the effective settings (flags > MKB_* environment > defaults).

    Example:

    \b
        mkb settings --json
    """
    settings = settings_from(ctx)
    data = settings.model_dump(mode="json") | {"db_path": str(settings.db_path)}
    emit([{"setting": k, "value": v} for k, v in data.items()], json_, csv_)


def register(main: click.Group) -> None:
    main.add_command(db)
    main.add_command(settings_cmd)
