"""`mkb report` and `mkb export`: every table and figure from the results database, and Parquet exports."""

from __future__ import annotations

import json
from pathlib import Path

import click

from mkb.cli import comma_separated, console, db_option, emit, output_options, require_writable, settings_from
from mkb.errors import MkbError

CLAIMS = Path(__file__).resolve().parents[2] / "artifact" / "claims.json"
COMPARE_COLUMNS = ["claim", "claimed", "reproduced", "basis", "verdict"]


def _load(store, models: list[str] | None):
    from mkb.analysis.data import available_models, load_results

    available = [m.name for m in available_models(store)]
    unknown = [m for m in models or [] if m not in available]
    if unknown:
        raise MkbError(f"no trials for model(s) {', '.join(unknown)} in {store.path}. "
                       f"Models there: {', '.join(available) or 'none'}.")
    results = load_results(store, models)
    if results.is_empty:
        raise MkbError(f"{store.path} has no finished trials to report on. Run a protocol first, e.g. "
                       f"'mkb run-model reference' (needs no model or key).")
    return results


@click.command(name="report")
@db_option
@click.option("--out", "out_dir", type=click.Path(file_okay=False), help="Output directory (default <home>/report).")
@click.option("--models", multiple=True, callback=comma_separated(),
              help="Models to include, comma-separated or repeated (default: all).")
@click.option("--compare-claims", is_flag=True, help="Also compare with the paper's claims and print the comparison.")
@click.option("--claims", "claims_path", type=click.Path(dir_okay=False), help="Claims file (default artifact/claims.json).")
@click.option("--no-figures", is_flag=True, help="Tables only (faster).")
@click.option("--html", is_flag=True,
              help="Also write a browsable offline site: index.html, a page per model and direction, a page "
                   "per cell with both transcripts, the skill and the kernel diff, and per-trial JSON.")
@output_options
@click.pass_context
def report(ctx, out_dir, models, compare_claims, claims_path, no_figures, html, json_=False, csv_=False):
    """Write every table (Markdown, CSV, LaTeX) and figure (PNG, PDF) plus index.md from the database.

    Prints the index path (or, with --compare-claims, the claimed-vs-reproduced rows) on stdout.
    With --html, also index.html and site/: open index.html in any browser (no server needed).

    Example:

    \b
        mkb report --db results/mkb.duckdb --out results/report --html
        mkb report --models gpt-5,reference --compare-claims --json
    """
    from mkb.analysis.claims import compare, load_claims
    from mkb.analysis.report import write_report
    from mkb.store import Store

    settings = settings_from(ctx)
    with Store(settings.db_path, read_only=True) as store:
        results = _load(store, list(models) or None)
    claims = None
    if compare_claims:
        path = Path(claims_path) if claims_path else CLAIMS
        if not path.is_file():
            raise MkbError(f"claims file {path} not found. Pass one with --claims (see artifact/claims.json).")
        claims = load_claims(path)
    out = Path(out_dir) if out_dir else settings.home / "report"
    require_writable(out, "the report is written there", "Pass --out with a writable directory.")
    written = write_report(results, out, claims, with_figures=not no_figures,
                           site_db=settings.db_path if html else None)
    console.print(f"{len(written.tables)} table files and {len(written.figures)} figure files in {out}; "
                  f"start at {written.site or written.index}")
    if claims is not None:
        emit(compare(results, claims), json_, csv_, title="The paper's claims: claimed vs reproduced",
             columns=None if json_ else COMPARE_COLUMNS)
        if json_ or csv_:
            return
    elif json_:
        click.echo(json.dumps({"index": str(written.index), "tables": [str(p) for p in written.tables],
                               "figures": [str(p) for p in written.figures],
                               "site": None if written.site is None else str(written.site)}, indent=2))
        return
    click.echo(str(written.site or written.index))


@click.command(name="export")
@click.option("--parquet", "parquet_dir", required=True, type=click.Path(file_okay=False),
              help="Directory for one <name>.parquet per table and view, plus cell_scores and params.json.")
@db_option
@click.pass_context
def export(ctx, parquet_dir):
    """Export every table, every analysis view and the scored cells as Parquet files.

    Schema and example queries: docs/results-schema.md.

    Example:

    \b
        mkb export --parquet results/export
        duckdb -c "SELECT * FROM 'results/export/cell_scores.parquet' WHERE outcome = 'harm'"
    """
    from mkb.analysis.export import export_parquet
    from mkb.store import Store

    settings = settings_from(ctx)
    with Store(settings.db_path, read_only=True) as store:
        written = export_parquet(store, Path(parquet_dir))
    console.print(f"{len(written)} files in {parquet_dir}")
    for path in written:
        click.echo(str(path))


def register(main: click.Group) -> None:
    main.add_command(report)
    main.add_command(export)
