"""The DuckDB store: schema, migrations, transactions, corrupt/newer/locked files."""

from __future__ import annotations

import subprocess
import sys

import duckdb
import pytest

from mkb import store as store_mod
from mkb.errors import StoreError
from mkb.problems import load_catalog
from mkb.settings import load_settings
from mkb.store import Store


def test_new_database_has_every_table_and_the_schema_version(store):
    tables = {r[0] for r in store.query("SELECT table_name FROM information_schema.tables")[1]}
    assert {"problems", "problem_checks", "runs", "trials", "attempts", "messages", "submissions", "skills",
            "evaluations", "schema_migrations"} <= tables
    assert store.schema_version == store_mod.SCHEMA_VERSION


def test_migrations_apply_once_and_are_recorded(tmp_path, monkeypatch):
    path = tmp_path / "m.duckdb"
    Store(path).close()
    applied = []

    def m002_add_note(db):
        applied.append(1)
        db.execute("ALTER TABLE trials ADD COLUMN note VARCHAR")

    monkeypatch.setattr(store_mod, "MIGRATIONS", store_mod.MIGRATIONS + [m002_add_note])
    monkeypatch.setattr(store_mod, "SCHEMA_VERSION", 2)
    for _ in range(2):
        with Store(path) as s:
            assert s.schema_version == 2
            assert "note" in s.query("SELECT * FROM trials LIMIT 0")[0]
    assert applied == [1]
    with Store(path) as s:
        names = [r[0] for r in s.query("SELECT name FROM schema_migrations ORDER BY version")[1]]
    assert names == ["m001_initial", "m002_add_note"]


def test_a_newer_database_is_refused_not_overwritten(tmp_path):
    path = tmp_path / "new.duckdb"
    with Store(path) as s:
        s.insert("schema_migrations", {"version": 99, "name": "future", "applied_at": store_mod.now()})
    before = path.read_bytes()
    with pytest.raises(StoreError, match="newer than this mkb"):
        Store(path)
    assert path.read_bytes() == before


def test_a_corrupt_file_gives_a_clear_error_and_is_left_alone(tmp_path):
    path = tmp_path / "corrupt.duckdb"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="not a readable mkb database"):
        Store(path)
    assert path.read_bytes() == b"this is not a database" * 100


def test_a_foreign_duckdb_file_is_refused(tmp_path):
    path = tmp_path / "other.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE t (x INTEGER)")
    con.close()
    with pytest.raises(StoreError, match="not an mkb database"):
        Store(path)


def test_a_second_writer_process_is_refused_with_a_clear_message(tmp_path):
    path = tmp_path / "locked.duckdb"
    with Store(path):
        code = ("from mkb.store import Store\nfrom mkb.errors import StoreError\n"
                f"try:\n    Store({str(path)!r})\nexcept StoreError as e:\n    print(e)\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "in use by another mkb process" in out.stdout


def test_read_only_on_missing_file_says_how_to_create_it(tmp_path):
    with pytest.raises(StoreError, match="mkb db init"):
        Store(tmp_path / "absent.duckdb", read_only=True)


def test_failed_transaction_rolls_back(store):
    with pytest.raises(RuntimeError):
        with store.transaction() as db:
            db.execute("INSERT INTO runs (run_id, model, started_at) VALUES ('r', 'm', now())")
            raise RuntimeError("boom")
    assert store.rows("SELECT * FROM runs") == []


def test_problems_table_filled_from_the_catalog(store):
    catalog = load_catalog(load_settings().problems_dir)
    store.upsert_problems(catalog)
    store.upsert_problems(catalog)  # idempotent
    rows = store.rows("SELECT problem_id, fingerprint FROM problems ORDER BY number")
    assert [r["problem_id"] for r in rows] == [p.id for p in catalog]
    assert rows[0]["fingerprint"] == catalog[0].fingerprint


def test_attempt_transcript_and_trial_roundtrip(store):
    store.start_run("run1", "openai/x", is_oracle=False)
    store.start_attempt("a1", "openai/x", "p28_r1_solo_tirx", run_id="run1")
    store.add_message("a1", 0, {"role": "system", "content": "hi", "extra": {"prompt_tokens": 5}})
    store.add_message("a1", 1, {"role": "assistant", "content": None,
                                "tool_calls": [{"id": "c1", "type": "function",
                                                "function": {"name": "bash", "arguments": "{}"}}]})
    with pytest.raises(duckdb.ConstraintException):
        store.add_message("a1", 1, {"role": "user", "content": "dup"})
    store.finish_attempt("a1", "finished", "incorrect", usage={"prompt_tokens": 5})
    store.upsert_trial("openai/x", "p28_r1_solo_tirx", problem_id="p28", replicate=1, arm="solo_tirx",
                       dsl="tirx", state="finished", status="incorrect", attempt_id="a1")
    sha = store.put_skill("openai/x", "p28_r1_solo_tirx", "a1", "tile rows; fuse the add")
    messages = store.messages("a1")
    assert [m["role"] for m in messages] == ["system", "assistant"]
    assert messages[0]["prompt_tokens"] == 5
    assert store.trials("openai/x")[0]["status"] == "incorrect"
    assert store.skill("openai/x", "p28_r1_solo_tirx")["sha256"] == sha
    assert store.rows("SELECT state, status FROM attempts") == [{"state": "finished", "status": "incorrect"}]
