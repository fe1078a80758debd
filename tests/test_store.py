"""The DuckDB store: schema, migrations (a database written by an older mkb), typed rows, corrupt/newer/locked files."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from mkb.errors import MkbError, StoreError
from mkb.problems import load_catalog
from mkb.records import Arm, Dsl, State, Status
from mkb.settings import load_settings
from mkb.store import ROWS, Attempt, Message, Run, Skill, Store, StoredSubmission, Trial, migrations, now

DATA = Path(__file__).resolve().parent / "data"
MAIN_DB = DATA / "db-main-49a1281"
"""A database written by mkb at commit 49a1281 (schema 1): one `mkb attempt` and one `mkb run-model` trial,
exported with DuckDB's EXPORT DATABASE (tests/data/README.md says how it was made)."""


def import_main_db(path: Path) -> Path:
    """The schema-1 database of MAIN_DB, as a DuckDB file at path (nothing of mkb touches it)."""
    con = duckdb.connect(str(path))
    con.execute(f"IMPORT DATABASE '{MAIN_DB}'")
    con.close()
    return path


def test_new_database_has_every_table_and_the_schema_version(store):
    tables = {r[0] for r in store.query("SELECT table_name FROM information_schema.tables")[1]}
    assert {"problems", "problem_checks", "runs", "trials", "attempts", "messages", "submissions", "skills",
            "evaluations", "schema_migrations"} <= tables
    assert store.schema_version == migrations.latest()


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.table)
def test_each_row_record_has_exactly_its_tables_columns(store, row):
    """Adding a column means a migration and a field: this keeps the two together."""
    columns = store.query(f"SELECT * FROM {row.table} LIMIT 0")[0]
    assert sorted(row.model_fields) == sorted(columns)


def test_migrations_apply_once_and_are_recorded(tmp_path, monkeypatch):
    path = tmp_path / "m.duckdb"
    Store(path).close()
    applied = []

    def m999_add_note(db):
        applied.append(1)
        db.execute("ALTER TABLE trials ADD COLUMN note VARCHAR")

    monkeypatch.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS + [m999_add_note])
    for _ in range(2):
        with Store(path) as s:
            assert s.schema_version == migrations.latest()
            assert "note" in s.query("SELECT * FROM trials LIMIT 0")[0]
    assert applied == [1]
    with Store(path) as s:
        names = [r[0] for r in s.query("SELECT name FROM schema_migrations ORDER BY version")[1]]
    assert names == [m.__name__ for m in migrations.MIGRATIONS]


def test_a_database_written_by_main_migrates_and_wall_s_becomes_agent_time(tmp_path):
    path = import_main_db(tmp_path / "main.duckdb")
    con = duckdb.connect(str(path))  # the attempt's gradings waited 2.5 s for a GPU; a third trial lost queue_s
    con.execute("UPDATE trials SET queue_s = 2.5 WHERE trial_id = 'p28_r1_solo_cutedsl'")
    before = dict(con.execute("SELECT trial_id, wall_s FROM trials").fetchall())
    con.execute("INSERT INTO trials SELECT * REPLACE ('p28_r2_solo_cutedsl' AS trial_id, NULL AS queue_s) "
                "FROM trials WHERE trial_id = 'p28_r1_solo_cutedsl'")
    con.close()
    with Store(path) as store:
        trials = {t.trial_id: t for t in store.trials()}
        assert store.schema_version == migrations.latest()
    assert trials["p28_r1_solo_cutedsl"].wall_s == pytest.approx(before["p28_r1_solo_cutedsl"] - 2.5)
    assert trials["p28_r1_solo_tirx"].wall_s == before["p28_r1_solo_tirx"]  # run-model's was agent time already
    assert trials["p28_r2_solo_cutedsl"].wall_s is None
    assert trials["p28_r2_solo_cutedsl"].message.endswith(migrations.WALL_S_UNKNOWN)
    assert {t.state for t in trials.values()} == {State.FINISHED}


def test_an_older_database_gains_the_protocol_columns_and_skills_by_attempt(tmp_path):
    path = import_main_db(tmp_path / "main.duckdb")
    con = duckdb.connect(str(path))  # a second skill row of an earlier attempt cannot exist under the old key:
    con.execute("UPDATE skills SET attempt_id = NULL WHERE trial_id = 'p28_r1_solo_tirx'")  # a row without an id
    con.close()
    with Store(path) as store:
        trials = {t.trial_id: t for t in store.trials()}
        skills = {s.trial_id: s for s in store.select(Skill)}
        finals = {s.attempt_id: s.n_correct_draws for s in store.select(StoredSubmission, "kind = 'final'")}
        assert store.skill("vllm/scripted", "p28_r1_solo_tirx").text == skills["p28_r1_solo_tirx"].text
    cutedsl, tirx = trials["p28_r1_solo_cutedsl"], trials["p28_r1_solo_tirx"]
    assert (tirx.ending, tirx.timed_out) == ("finish", False)  # from the message it ended with
    assert (cutedsl.ending, cutedsl.timed_out) == (None, None)  # its message names no ending
    assert tirx.n_correct_draws == finals[tirx.attempt_id] == 0 and cutedsl.charged_s is None
    assert skills["p28_r1_solo_cutedsl"].attempt_id == cutedsl.attempt_id
    assert skills["p28_r1_solo_tirx"].attempt_id == tirx.attempt_id  # taken from its trial's current attempt
    skill = skills["p28_r1_solo_cutedsl"]
    assert (skill.n_chars, skill.n_words) == (len(skill.text), len(skill.text.split()))


def test_a_read_only_open_of_an_older_database_migrates_a_copy_and_leaves_the_file(tmp_path):
    path = import_main_db(tmp_path / "main.duckdb")
    before = path.read_bytes()
    with Store(path, read_only=True) as store:
        assert store.schema_version == migrations.latest()
        assert [t.trial_id for t in store.trials()] == ["p28_r1_solo_cutedsl", "p28_r1_solo_tirx"]
        assert store.rows("SELECT count(*) AS n FROM trial_outcomes WHERE attempted") == [{"n": 2}]
    assert path.read_bytes() == before


def test_the_shipped_results_open_read_only(tmp_path):
    shipped = Path(__file__).resolve().parent.parent / "artifact" / "results" / "mkb-h200.duckdb"
    copy = shutil.copy(shipped, tmp_path / "shipped.duckdb")
    with Store(copy, read_only=True) as store:
        trials = store.trials("reference")
    assert len(trials) == 48 and {(t.state, t.status) for t in trials} == {(State.FINISHED, Status.PASSED)}


def test_a_newer_database_is_refused_not_overwritten(tmp_path):
    path = tmp_path / "new.duckdb"
    with Store(path) as s:
        s.insert("schema_migrations", {"version": 99, "name": "future", "applied_at": now()})
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
    for read_only in (False, True):
        with pytest.raises(StoreError, match="not an mkb database"):
            Store(path, read_only=read_only)


def test_a_second_writer_process_is_refused_with_a_clear_message(tmp_path):
    path = tmp_path / "locked.duckdb"
    with Store(path):
        code = ("from mkb.store import Store\nfrom mkb.errors import StoreError\n"
                f"try:\n    Store({str(path)!r})\nexcept StoreError as e:\n    print(e)\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "in use by another mkb process" in out.stdout


def test_a_directory_given_as_the_database_is_named_as_such(tmp_path):
    for read_only in (False, True):
        with pytest.raises(StoreError, match=f"{tmp_path} is a directory. Point --db at a database file"):
            Store(tmp_path, read_only=read_only)


def test_read_only_on_missing_file_says_how_to_create_it(tmp_path):
    with pytest.raises(StoreError, match="mkb db init"):
        Store(tmp_path / "absent.duckdb", read_only=True)


def test_failed_transaction_rolls_back(store):
    with pytest.raises(RuntimeError):
        with store.transaction() as db:
            db.execute("INSERT INTO runs (run_id, model, started_at) VALUES ('r', 'm', now())")
            raise RuntimeError("boom")
    assert store.select(Run) == []


def test_problems_table_filled_from_the_catalog(store):
    catalog = load_catalog(load_settings().problems_dir)
    store.upsert_problems(catalog)
    store.upsert_problems(catalog)  # idempotent
    rows = store.rows("SELECT problem_id, fingerprint FROM problems ORDER BY number")
    assert [r["problem_id"] for r in rows] == [p.id for p in catalog]
    assert rows[0]["fingerprint"] == catalog[0].fingerprint


def test_typed_rows_go_in_whole_and_come_back_as_records(store):
    at = now()
    trial = Trial(model="openai/x", trial_id="p28_r1_solo_tirx", problem_id="p28", replicate=1, arm=Arm.SOLO_TIRX,
                  dsl=Dsl.TIRX, state=State.RUNNING, attempt_id="a1", fingerprint_parts={"problem": "abc"},
                  started_at=at)
    store.put(Attempt(attempt_id="a1", model="openai/x", trial_id=trial.trial_id, state=State.RUNNING,
                      budget={"wall_s": 2400.0}, started_at=at), trial)
    store.add(Message(attempt_id="a1", seq=0, role="system", content="hi", extra={"wall_s": 0.1}, created_at=at))
    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
    store.add(Message(attempt_id="a1", seq=1, role="assistant", tool_calls=[call], prompt_tokens=5, created_at=at))
    with pytest.raises(duckdb.ConstraintException):
        store.add(Message(attempt_id="a1", seq=1, role="user", content="dup", created_at=at))
    store.add(StoredSubmission(attempt_id="a1", n=1, kind="final", status=Status.INCORRECT,
                               record={"status": "incorrect", "problem": "p28", "dsl": "tirx", "device": "cpu"},
                               created_at=at))
    store.put(trial.model_copy(update={"state": State.FINISHED, "status": Status.INCORRECT}))
    store.put(Skill(model="openai/x", trial_id=trial.trial_id, attempt_id="a1", text="tile rows", sha256="s",
                    created_at=at))
    store.put(Skill(model="openai/x", trial_id=trial.trial_id, attempt_id="a0", text="an earlier attempt's", sha256="e",
                    created_at=at))
    assert store.trial("openai/x", trial.trial_id) == trial.model_copy(
        update={"state": State.FINISHED, "status": Status.INCORRECT})
    assert [m.wire() for m in store.messages("a1")] == [
        {"role": "system", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [call]}]
    assert store.submissions("a1")[0].judge_record().status == Status.INCORRECT
    assert store.find_attempt(trial.trial_id).budget == {"wall_s": 2400.0} == store.find_attempt("a").budget
    assert store.skill("openai/x", trial.trial_id).text == "tile rows"  # the current attempt's, never a0's
    store.delete(Skill, attempt_id="a1")
    assert store.skill("openai/x", trial.trial_id) is None
    with pytest.raises(MkbError, match="no trial or attempt 'p99'"):
        store.find_attempt("p99")


def test_views_name_states_statuses_and_arms_only_through_the_enums():
    import re

    from mkb.records import Arm
    from mkb.store.database import VIEWS_SQL

    literals = set(re.findall(r"'([a-z0-9_]+)'", VIEWS_SQL.read_text()))
    assert not literals & {*State, *Status, *Arm}
