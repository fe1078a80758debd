"""Export the database for analysis elsewhere: every table, every view and the scored cells as Parquet."""

from __future__ import annotations

import json
import typing
from dataclasses import fields
from pathlib import Path

from mkb.analysis.data import Cell, load_results
from mkb.analysis.params import DEFAULT, Params
from mkb.store import Store

SCORED = "cell_scores"
"""The scored cells (data.Cell: tiers, values, r, outcome, standing), computed with the parameters."""

_SQL_TYPES = {str: "VARCHAR", int: "BIGINT", float: "DOUBLE", bool: "BOOLEAN"}


def _sql_type(name: str) -> str:
    hint = typing.get_type_hints(Cell)[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    return _SQL_TYPES[args[0]]


def _quote_path(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def _load_scored(store: Store, params: Params) -> None:
    """Create the TEMP table cell_scores from the scored cells (allowed on a read-only database)."""
    names = [f.name for f in fields(Cell)]
    columns = ", ".join(f"{n} {_sql_type(n)}" for n in names)
    store.query(f"CREATE OR REPLACE TEMP TABLE {SCORED} ({columns})")
    rows = [tuple(getattr(c, n) for n in names) for c in load_results(store, params=params).cells]
    placeholders = "(" + ", ".join("?" * len(names)) + ")"
    for start in range(0, len(rows), 100):
        chunk = rows[start:start + 100]
        store.query(f"INSERT INTO {SCORED} VALUES {', '.join([placeholders] * len(chunk))}",
                    [v for row in chunk for v in row])


def relations(store: Store) -> list[str]:
    """Every base table of the database and every view of views.sql, by name."""
    _, tables = store.query("SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
                            "AND NOT temporary ORDER BY table_name")
    _, views = store.query("SELECT view_name FROM duckdb_views() WHERE temporary AND NOT internal "
                           "ORDER BY view_name")
    return [r[0] for r in tables] + [r[0] for r in views]


def export_parquet(store: Store, out_dir: Path, params: Params = DEFAULT) -> list[Path]:
    """Write <name>.parquet for every table and view, cell_scores.parquet and params.json."""
    out_dir.mkdir(parents=True, exist_ok=True)
    _load_scored(store, params)
    written = []
    for name in [*relations(store), SCORED]:
        path = out_dir / f"{name}.parquet"
        store.query(f'COPY (SELECT * FROM "{name}") TO {_quote_path(path)} (FORMAT parquet)')
        written.append(path)
    params_path = out_dir / "params.json"
    params_path.write_text(json.dumps(params.as_dict(), indent=2, sort_keys=True) + "\n")
    return written + [params_path]
