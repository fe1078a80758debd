"""Store: the one DuckDB results file — opening, migrating, transactions, typed rows in and out, views."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

import duckdb

from mkb.errors import MkbError, StoreError
from mkb.records import Arm, State, Status
from mkb.store import access, migrations, owner
from mkb.store.rows import Attempt, Message, Row, Skill, StoredSubmission, Trial

VIEWS_SQL = Path(__file__).with_name("views.sql")
R = TypeVar("R", bound=Row)


def now() -> datetime:
    """Timestamps are stored in UTC."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


def _jsonable(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, default=str)
    if hasattr(value, "model_dump"):
        return value.model_dump_json()
    return value


class Store:
    """The results database. One process writes; threads share it through a lock.

    A read-only open never writes the file: a file of an older schema is migrated in a private
    in-memory copy.

    Raises:
        StoreError: the file is not an mkb database, is corrupt, is newer than this mkb,
            or another process holds it.
    """

    def __init__(self, path: Path | str, read_only: bool = False):
        self.path = Path(path)
        self.read_only = read_only
        self._lock = threading.RLock()
        if read_only and not self.path.exists():
            raise StoreError(f"no results database at {self.path}. Run 'mkb db init' or a benchmark command first.")
        access.make_parent(self.path)
        try:
            self.db = duckdb.connect(str(self.path), read_only=read_only)
        except duckdb.Error as exc:
            raise StoreError(access.explain(self.path, read_only, exc)) from None
        try:
            if read_only and self._pending():
                self._open_migrated_copy()
            self._migrate()
            self._create_views()
            if not read_only:
                with self.transaction() as db:
                    owner.reap(db)
        except StoreError:
            self.db.close()
            raise
        except duckdb.Error as exc:  # e.g. the write-ahead log cannot be made next to a file in a read-only directory
            self.db.close()
            raise StoreError(access.explain(self.path, read_only, exc)) from None

    def _tables(self) -> set[str]:
        return {r[0] for r in self.db.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'").fetchall()}

    def _applied(self) -> set[int]:
        tables = self._tables()
        if tables and "schema_migrations" not in tables:
            raise StoreError(f"{self.path} is a DuckDB file but not an mkb database. Point --db at another file.")
        if "schema_migrations" not in tables:
            return set()
        return {r[0] for r in self.db.execute("SELECT version FROM schema_migrations").fetchall()}

    def _pending(self) -> bool:
        applied = self._applied()
        if not applied:
            raise StoreError(f"{self.path} is empty. Run 'mkb db init' first.")
        return bool({migrations.version(m) for m in migrations.MIGRATIONS} - applied)

    def _open_migrated_copy(self) -> None:
        """Swap the read-only file for an in-memory copy of it that can be migrated."""
        self.db.close()
        self.db = duckdb.connect(":memory:")
        self.db.execute("ATTACH ? AS source (READ_ONLY)", [str(self.path)])
        self.db.execute("COPY FROM DATABASE source TO memory")
        self.db.execute("DETACH source")

    def _migrate(self) -> None:
        done = self._applied()
        if "schema_migrations" not in self._tables():
            self.db.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name VARCHAR, "
                            "applied_at TIMESTAMP)")
        unknown = done - {migrations.version(m) for m in migrations.MIGRATIONS}
        if unknown:
            raise StoreError(f"{self.path} has schema version {max(unknown)}, newer than this mkb knows (its newest "
                             f"is {migrations.latest()}). Upgrade mkb (git pull; make install) to read it.")
        for step in sorted(migrations.MIGRATIONS, key=migrations.version):
            version = migrations.version(step)
            if version not in done:
                with self.transaction() as db:
                    step(db)
                    db.execute("INSERT INTO schema_migrations VALUES (?, ?, ?)", [version, step.__name__, now()])

    def _create_views(self) -> None:
        sql = VIEWS_SQL.read_text().format(state=State, status=Status, arm=Arm)
        for statement in sql.split(";\n"):
            if statement.strip():
                self.db.execute(statement.replace("CREATE OR REPLACE VIEW", "CREATE OR REPLACE TEMP VIEW"))

    @property
    def schema_version(self) -> int:
        return int(self.db.execute("SELECT max(version) FROM schema_migrations").fetchone()[0] or 0)

    @contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A transaction on a thread-local cursor; rolled back if the block raises."""
        with self._lock:
            cursor = self.db.cursor()
            cursor.execute("BEGIN TRANSACTION")
            try:
                yield cursor
            except BaseException:
                cursor.execute("ROLLBACK")
                raise
            else:
                cursor.execute("COMMIT")
            finally:
                cursor.close()

    def upsert(self, table: str, row: dict[str, Any], keys: tuple[str, ...],
               db: duckdb.DuckDBPyConnection | None = None) -> None:
        """Insert a row, or update the existing row with the same key columns (inside db's transaction if given)."""
        if db is None:
            with self.transaction() as db:
                return self.upsert(table, row, keys, db)
        cols = list(row)
        updates = ", ".join(f"{c} = excluded.{c}" for c in cols if c not in keys)
        conflict = f"ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {updates}" if updates else "ON CONFLICT DO NOTHING"
        db.execute(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))}) {conflict}",
                   [_jsonable(row[c]) for c in cols])

    def insert(self, table: str, row: dict[str, Any]) -> None:
        """Insert one row (fails on a duplicate key)."""
        cols = list(row)
        with self.transaction() as db:
            db.execute(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                       [_jsonable(row[c]) for c in cols])

    def query(self, sql: str, params: list | None = None) -> tuple[list[str], list[tuple]]:
        """Run SQL; return (column names, rows)."""
        # On the main connection, not a cursor: a cursor is a separate DuckDB connection and
        # cannot see the TEMP views of views.sql. The lock serialises use of self.db.
        with self._lock:
            try:
                result = self.db.execute(sql, params or [])
                if result.description is None:
                    return [], []
                return [d[0] for d in result.description], result.fetchall()
            except duckdb.Error as exc:
                raise StoreError(f"query failed: {str(exc).splitlines()[0]}") from None

    def rows(self, sql: str, params: list | None = None) -> list[dict[str, Any]]:
        """Run SQL; return rows as dicts."""
        cols, rows = self.query(sql, params)
        return [dict(zip(cols, r)) for r in rows]

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- typed rows ----------------------------------------------------------------------------

    def put(self, *rows: Row) -> None:
        """Write rows whole, in one transaction: insert each, or replace the row with the same key."""
        with self.transaction() as db:
            for row in rows:
                self.upsert(row.table, row.columns(), row.keys, db)

    def add(self, row: Row) -> None:
        """Insert a row that must be new (a transcript message, a graded submission)."""
        self.insert(row.table, row.columns())

    def delete(self, cls: type[Row], **key: Any) -> None:
        """Remove the row of cls with this key, if there is one."""
        with self.transaction() as db:
            db.execute(f"DELETE FROM {cls.table} WHERE {' AND '.join(f'{k} = ?' for k in cls.keys)}",
                       [key[k] for k in cls.keys])

    def select(self, cls: type[R], where: str = "TRUE", params: list | None = None) -> list[R]:
        """The rows of cls's table matching a SQL condition, in key order, as records."""
        found = self.rows(f"SELECT * FROM {cls.table} WHERE {where} ORDER BY {', '.join(cls.keys)}", params)
        return [cls.model_validate(r) for r in found]

    def finish_run(self, run_id: str, state: State) -> None:
        """Mark a run finished or interrupted."""
        with self.transaction() as db:
            db.execute("UPDATE runs SET state = ?, finished_at = ? WHERE run_id = ?", [str(state), now(), run_id])

    def trial(self, model: str, trial_id: str) -> Trial | None:
        """The current state of one trial, or None."""
        found = self.select(Trial, "model = ? AND trial_id = ?", [model, trial_id])
        return found[0] if found else None

    def trials(self, model: str | None = None) -> list[Trial]:
        """All trials, optionally of one model."""
        return self.select(Trial) if model is None else self.select(Trial, "model = ?", [model])

    def skill(self, model: str, trial_id: str) -> Skill | None:
        """The skill a solo trial's current attempt left, or None (an earlier attempt's never counts)."""
        found = self.current_skills(model, trial_id)
        return found[0] if found else None

    def current_skills(self, model: str, trial_id: str | None = None) -> list[Skill]:
        """The skills that the current attempts of a model's trials (or of one trial) left."""
        where = "attempt_id IN (SELECT attempt_id FROM trials WHERE model = ? AND attempt_id IS NOT NULL" + \
            (" AND trial_id = ?)" if trial_id else ")")
        return self.select(Skill, f"model = ? AND {where}", [model, model, *([trial_id] if trial_id else [])])

    def messages(self, attempt_id: str) -> list[Message]:
        """The transcript of one attempt, in order."""
        return self.select(Message, "attempt_id = ?", [attempt_id])

    def submissions(self, attempt_id: str) -> list[StoredSubmission]:
        """The gradings of one attempt, in order."""
        return self.select(StoredSubmission, "attempt_id = ?", [attempt_id])

    def find_attempt(self, key: str) -> Attempt:
        """An attempt by attempt id (or a unique prefix), or a trial id's current attempt.

        Raises:
            MkbError: nothing matches, or a prefix is ambiguous.
        """
        current = self.rows("SELECT attempt_id FROM trials WHERE trial_id = ? AND attempt_id IS NOT NULL "
                            "ORDER BY started_at DESC NULLS LAST LIMIT 1", [key])
        found = self.select(Attempt, "attempt_id = ?", [current[0]["attempt_id"]]) if current else \
            self.select(Attempt, "starts_with(attempt_id, ?)", [key])
        if not found:
            raise MkbError(f"no trial or attempt '{key}' in {self.path}. List them with "
                           f"mkb db query \"SELECT trial_id, attempt_id, state, status FROM attempts\".")
        if len(found) > 1:
            raise MkbError(f"'{key}' matches {len(found)} attempts; give more of the attempt id.")
        return found[0]

    # -- problems and gradings outside attempts -----------------------------------------------

    def upsert_problems(self, problems: list) -> None:
        """Record catalog entries (ProblemInfo) in the problems table."""
        for p in problems:
            self.upsert("problems", {
                "problem_id": p.id, "number": p.number, "name": p.name, "family": p.family,
                "dtype": p.dtype, "description": p.description, "source": p.source,
                "fingerprint": p.fingerprint, "sol_flops": p.sol_flops, "sol_bytes": p.sol_bytes,
                "exact": p.exact, "updated_at": now()}, keys=("problem_id",))

    def add_problem_check(self, report, environment: dict) -> str:
        """Record one QA report (mkb.qa.QaReport); returns its id."""
        check_id = uuid.uuid4().hex
        self.insert("problem_checks", {
            "check_id": check_id, "problem_id": report.problem, "fingerprint": report.fingerprint,
            "scale": report.scale, "device": report.device, "ok": report.ok, "eager_ms": report.eager_ms,
            "peak_mem_bytes": report.peak_mem_bytes, "ref_rel_error": report.ref_rel_error,
            "report": report.model_dump(mode="json"), "environment": environment, "created_at": now()})
        return check_id

    def add_evaluation(self, record, origin: str, kernel_path: str | None = None,
                       kernel_sha256: str | None = None) -> str:
        """Record one judge record (mkb.records.JudgeRecord) outside any attempt; returns its id."""
        eval_id = uuid.uuid4().hex
        self.insert("evaluations", {
            "eval_id": eval_id, "problem_id": record.problem, "dsl": str(record.dsl), "origin": origin,
            "kernel_path": kernel_path, "kernel_sha256": kernel_sha256, "device": record.device,
            "status": str(record.status), "speedup": record.speedup, "kernel_ms": record.kernel_ms,
            "eager_ms": record.eager_ms, "record": record.model_dump(mode="json"), "created_at": now()})
        return eval_id
