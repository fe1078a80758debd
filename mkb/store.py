"""Store: the one DuckDB results file — schema, migrations, transactional writes, views."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import duckdb

from mkb.errors import StoreError

APP_ID = "mkb-results"
VIEWS_SQL = Path(__file__).with_name("views.sql")

MIGRATIONS: list[Callable[[duckdb.DuckDBPyConnection], None]] = []
migration = MIGRATIONS.append


def now() -> datetime:
    """Timestamps are stored in UTC."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


@migration
def m001_initial(db: duckdb.DuckDBPyConnection) -> None:
    """The tables of DESIGN §8."""
    db.execute("""
    CREATE TABLE problems (
        problem_id VARCHAR PRIMARY KEY, number INTEGER NOT NULL, name VARCHAR NOT NULL,
        family VARCHAR NOT NULL, dtype VARCHAR, description VARCHAR, source VARCHAR,
        fingerprint VARCHAR NOT NULL, sol_flops DOUBLE, sol_bytes DOUBLE, exact BOOLEAN,
        updated_at TIMESTAMP NOT NULL)""")
    db.execute("""
    CREATE TABLE problem_checks (
        check_id VARCHAR PRIMARY KEY, problem_id VARCHAR NOT NULL, fingerprint VARCHAR,
        scale VARCHAR NOT NULL, device VARCHAR NOT NULL, ok BOOLEAN NOT NULL, eager_ms DOUBLE,
        peak_mem_bytes BIGINT, ref_rel_error DOUBLE, report JSON, environment JSON,
        created_at TIMESTAMP NOT NULL)""")
    db.execute("""
    CREATE TABLE runs (
        run_id VARCHAR PRIMARY KEY, model VARCHAR NOT NULL, provider VARCHAR, base_url VARCHAR,
        api_key_env VARCHAR, is_oracle BOOLEAN DEFAULT FALSE, params JSON, versions JSON,
        git_commit VARCHAR, host VARCHAR, gpus JSON, command VARCHAR, state VARCHAR,
        started_at TIMESTAMP NOT NULL, finished_at TIMESTAMP)""")
    db.execute("""
    CREATE TABLE trials (
        model VARCHAR NOT NULL, trial_id VARCHAR NOT NULL, run_id VARCHAR, attempt_id VARCHAR,
        problem_id VARCHAR NOT NULL, replicate INTEGER NOT NULL, arm VARCHAR NOT NULL,
        dsl VARCHAR NOT NULL, source_trial_id VARCHAR, state VARCHAR NOT NULL, status VARCHAR,
        speedup DOUBLE, kernel_ms DOUBLE, eager_ms DOUBLE, fingerprint VARCHAR,
        fingerprint_parts JSON, skill_sha256 VARCHAR, started_at TIMESTAMP, finished_at TIMESTAMP,
        wall_s DOUBLE,
        queue_s DOUBLE, n_submissions INTEGER, n_turns INTEGER, prompt_tokens BIGINT,
        completion_tokens BIGINT, cost_usd DOUBLE, message VARCHAR,
        PRIMARY KEY (model, trial_id))""")
    db.execute("""
    CREATE TABLE attempts (
        attempt_id VARCHAR PRIMARY KEY, model VARCHAR NOT NULL, trial_id VARCHAR NOT NULL,
        run_id VARCHAR, state VARCHAR NOT NULL, status VARCHAR, fingerprint VARCHAR,
        sandbox VARCHAR, budget JSON, usage JSON, message VARCHAR,
        started_at TIMESTAMP NOT NULL, finished_at TIMESTAMP)""")
    db.execute("""
    CREATE TABLE messages (
        attempt_id VARCHAR NOT NULL, seq INTEGER NOT NULL, role VARCHAR NOT NULL,
        content VARCHAR, tool_calls JSON, tool_call_id VARCHAR, name VARCHAR,
        prompt_tokens BIGINT, completion_tokens BIGINT, extra JSON, created_at TIMESTAMP NOT NULL,
        PRIMARY KEY (attempt_id, seq))""")
    db.execute("""
    CREATE TABLE submissions (
        attempt_id VARCHAR NOT NULL, n INTEGER NOT NULL, kind VARCHAR NOT NULL,
        status VARCHAR NOT NULL, speedup DOUBLE, kernel_ms DOUBLE, eager_ms DOUBLE,
        kernel_sha256 VARCHAR, kernel_source VARCHAR, queue_s DOUBLE, record JSON,
        created_at TIMESTAMP NOT NULL, PRIMARY KEY (attempt_id, n))""")
    db.execute("""
    CREATE TABLE skills (
        model VARCHAR NOT NULL, trial_id VARCHAR NOT NULL, attempt_id VARCHAR,
        text VARCHAR NOT NULL, sha256 VARCHAR NOT NULL, created_at TIMESTAMP NOT NULL,
        PRIMARY KEY (model, trial_id))""")
    db.execute("""
    CREATE TABLE evaluations (
        eval_id VARCHAR PRIMARY KEY, problem_id VARCHAR NOT NULL, dsl VARCHAR NOT NULL,
        origin VARCHAR, kernel_path VARCHAR, kernel_sha256 VARCHAR, device VARCHAR,
        status VARCHAR NOT NULL, speedup DOUBLE, kernel_ms DOUBLE, eager_ms DOUBLE,
        record JSON, created_at TIMESTAMP NOT NULL)""")


SCHEMA_VERSION = len(MIGRATIONS)


def _jsonable(value: Any) -> Any:
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, default=str)
    if hasattr(value, "model_dump"):
        return value.model_dump_json()
    return value


class Store:
    """The results database. One process writes; threads share it through a lock.

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
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.db = duckdb.connect(str(self.path), read_only=read_only)
        except duckdb.Error as exc:
            raise StoreError(self._explain(exc)) from None
        try:
            self._migrate()
            self._create_views()
        except StoreError:
            self.db.close()
            raise

    def _explain(self, exc: Exception) -> str:
        text = str(exc)
        if "lock" in text.lower():
            return (f"{self.path} is in use by another mkb process. Wait for it to finish, "
                    f"or use another database with --db.")
        return (f"{self.path} is not a readable mkb database ({text.splitlines()[0][:160]}). "
                f"Move it aside and run 'mkb db init', or point --db elsewhere.")

    def _tables(self) -> set[str]:
        return {r[0] for r in self.db.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'").fetchall()}

    def _migrate(self) -> None:
        tables = self._tables()
        if tables and "schema_migrations" not in tables:
            raise StoreError(f"{self.path} is a DuckDB file but not an mkb database. "
                             f"Point --db at another file.")
        if "schema_migrations" not in tables:
            if self.read_only:
                raise StoreError(f"{self.path} is empty. Run 'mkb db init' first.")
            self.db.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name VARCHAR, "
                            "applied_at TIMESTAMP)")
        done = {r[0] for r in self.db.execute("SELECT version FROM schema_migrations").fetchall()}
        newest = max(done, default=0)
        if newest > SCHEMA_VERSION:
            raise StoreError(f"{self.path} has schema version {newest}, newer than this mkb's "
                             f"{SCHEMA_VERSION}. Upgrade mkb (git pull; make install) to read it.")
        for version, step in enumerate(MIGRATIONS, start=1):
            if version in done:
                continue
            if self.read_only:
                raise StoreError(f"{self.path} needs migration to schema {SCHEMA_VERSION}; open it once "
                                 f"without read-only access (e.g. 'mkb db init').")
            with self.transaction() as db:
                step(db)
                db.execute("INSERT INTO schema_migrations VALUES (?, ?, ?)", [version, step.__name__, now()])

    def _create_views(self) -> None:
        if VIEWS_SQL.exists():
            for statement in VIEWS_SQL.read_text().split(";\n"):
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

    def upsert(self, table: str, row: dict[str, Any], keys: tuple[str, ...]) -> None:
        """Insert a row, or update the existing row with the same key columns."""
        cols = list(row)
        values = [_jsonable(row[c]) for c in cols]
        updates = ", ".join(f"{c} = excluded.{c}" for c in cols if c not in keys)
        conflict = f"ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {updates}" if updates else "ON CONFLICT DO NOTHING"
        sql = f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))}) {conflict}"
        with self.transaction() as db:
            db.execute(sql, values)

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

    # -- problems ---------------------------------------------------------------------------

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
        import uuid

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
        import uuid

        eval_id = uuid.uuid4().hex
        self.insert("evaluations", {
            "eval_id": eval_id, "problem_id": record.problem, "dsl": str(record.dsl), "origin": origin,
            "kernel_path": kernel_path, "kernel_sha256": kernel_sha256, "device": record.device,
            "status": str(record.status), "speedup": record.speedup, "kernel_ms": record.kernel_ms,
            "eager_ms": record.eager_ms, "record": record.model_dump(mode="json"), "created_at": now()})
        return eval_id

    # -- runs, trials, attempts, transcripts --------------------------------------------------

    def start_run(self, run_id: str, model: str, **fields: Any) -> None:
        """Record the start of a protocol run (or a single attempt's run)."""
        self.upsert("runs", {"run_id": run_id, "model": model, "state": "running", "started_at": now(), **fields},
                    keys=("run_id",))

    def finish_run(self, run_id: str, state: str) -> None:
        """Mark a run finished / interrupted / failed."""
        with self.transaction() as db:
            db.execute("UPDATE runs SET state = ?, finished_at = ? WHERE run_id = ?", [state, now(), run_id])

    def start_attempt(self, attempt_id: str, model: str, trial_id: str, **fields: Any) -> None:
        """Record that an attempt began (state 'running'); every later write refers to attempt_id."""
        self.insert("attempts", {"attempt_id": attempt_id, "model": model, "trial_id": trial_id,
                                 "state": "running", "started_at": now(), **fields})

    def finish_attempt(self, attempt_id: str, state: str, status: str | None = None, **fields: Any) -> None:
        """Close an attempt: state finished / infra_error / interrupted / skipped, plus its final status."""
        sets = {"state": state, "status": status, "finished_at": now(), **fields}
        with self.transaction() as db:
            db.execute(f"UPDATE attempts SET {', '.join(f'{k} = ?' for k in sets)} WHERE attempt_id = ?",
                       [_jsonable(v) for v in sets.values()] + [attempt_id])

    def add_message(self, attempt_id: str, seq: int, message: dict[str, Any]) -> None:
        """Append one transcript message (OpenAI wire format; metadata under 'extra') as it happens."""
        extra = message.get("extra") or {}
        self.insert("messages", {
            "attempt_id": attempt_id, "seq": seq, "role": message.get("role", ""),
            "content": message.get("content") if isinstance(message.get("content"), str | None)
            else json.dumps(message.get("content")),
            "tool_calls": message.get("tool_calls"), "tool_call_id": message.get("tool_call_id"),
            "name": message.get("name"), "prompt_tokens": extra.get("prompt_tokens"),
            "completion_tokens": extra.get("completion_tokens"), "extra": extra, "created_at": now()})

    def messages(self, attempt_id: str) -> list[dict[str, Any]]:
        """The transcript of one attempt, in order."""
        return self.rows("SELECT * FROM messages WHERE attempt_id = ? ORDER BY seq", [attempt_id])

    def add_submission(self, attempt_id: str, n: int, kind: str, record, kernel_source: str | None = None,
                       kernel_sha256: str | None = None, queue_s: float | None = None) -> None:
        """Record one graded submission (kind 'feedback' or 'final') with its JudgeRecord."""
        self.insert("submissions", {
            "attempt_id": attempt_id, "n": n, "kind": kind, "status": str(record.status),
            "speedup": record.speedup, "kernel_ms": record.kernel_ms, "eager_ms": record.eager_ms,
            "kernel_sha256": kernel_sha256, "kernel_source": kernel_source, "queue_s": queue_s,
            "record": record.model_dump(mode="json"), "created_at": now()})

    def put_skill(self, model: str, trial_id: str, attempt_id: str | None, text: str) -> str:
        """Store the SKILL.md of a solo trial; returns its sha256."""
        import hashlib

        sha = hashlib.sha256(text.encode()).hexdigest()
        self.upsert("skills", {"model": model, "trial_id": trial_id, "attempt_id": attempt_id, "text": text,
                               "sha256": sha, "created_at": now()}, keys=("model", "trial_id"))
        return sha

    def skill(self, model: str, trial_id: str) -> dict[str, Any] | None:
        """The stored skill of a solo trial, or None."""
        found = self.rows("SELECT * FROM skills WHERE model = ? AND trial_id = ?", [model, trial_id])
        return found[0] if found else None

    def upsert_trial(self, model: str, trial_id: str, **fields: Any) -> None:
        """Create or update the current state of a trial (one row per model and trial id)."""
        self.upsert("trials", {"model": model, "trial_id": trial_id, **fields}, keys=("model", "trial_id"))

    def trials(self, model: str | None = None) -> list[dict[str, Any]]:
        """All trial rows, optionally of one model."""
        if model is None:
            return self.rows("SELECT * FROM trials ORDER BY model, trial_id")
        return self.rows("SELECT * FROM trials WHERE model = ? ORDER BY trial_id", [model])
