"""The results database's schema as numbered migrations: each applied once, in order, and recorded.

A change to the schema is a new function at the end, decorated with @migration and named
mNNN_what_it_does: NNN is its version (so a version never changes when branches that each added
migrations are merged; gaps are fine). The Store applies the ones a file lacks, in version order, when
it opens it (in memory for a read-only open). A new column also goes into its record in mkb/store/rows.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import duckdb

Migration = Callable[[duckdb.DuckDBPyConnection], None]
MIGRATIONS: list[Migration] = []


def version(step: Migration) -> int:
    """The version a migration's name carries (m010_run_owner -> 10)."""
    found = re.fullmatch(r"m(\d{3})_\w+", step.__name__)
    if found is None:
        raise ValueError(f"migration {step.__name__} must be named mNNN_what_it_does")
    return int(found.group(1))


def migration(step: Migration) -> Migration:
    """Register a migration (its version from its name; each version once)."""
    if version(step) in {version(m) for m in MIGRATIONS}:
        raise ValueError(f"migration version {version(step)} is taken ({step.__name__})")
    MIGRATIONS.append(step)
    return step


def latest() -> int:
    """The newest schema version this mkb knows."""
    return max(version(m) for m in MIGRATIONS)


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


WALL_S_UNKNOWN = "[wall_s unknown: recorded by mkb attempt with the queue time included, queue_s not recorded]"


@migration
def m002_wall_s_is_agent_time(db: duckdb.DuckDBPyConnection) -> None:
    """trials.wall_s is agent time on every path (the attempt's wall clock minus its judge queue time).

    Before this, `mkb attempt` stored the whole wall clock while run-model subtracted queue_s. A trial
    whose current attempt came from `mkb attempt` is recognised by its attempts row carrying a budget
    (run-model wrote none): queue_s is subtracted where it is known; elsewhere wall_s is cleared and the
    trial's message says why (WALL_S_UNKNOWN).
    """
    by_attempt = "attempt_id IN (SELECT attempt_id FROM attempts WHERE budget IS NOT NULL)"
    db.execute(f"UPDATE trials SET wall_s = greatest(wall_s - queue_s, 0) "
               f"WHERE wall_s IS NOT NULL AND queue_s IS NOT NULL AND {by_attempt}")
    db.execute(f"UPDATE trials SET wall_s = NULL, message = concat_ws(' ', message, ?) "
               f"WHERE wall_s IS NOT NULL AND queue_s IS NULL AND {by_attempt}", [WALL_S_UNKNOWN])


ENDINGS = ("finish", "time", "turns", "tokens", "context", "cancelled", "provider")
"""The loop's endings (mkb.agent.loop.ENDINGS), as a trial's message starts with them ('time: ...')."""


@migration
def m003_protocol_records(db: duckdb.DuckDBPyConnection) -> None:
    """What the paper's protocol records besides the verdict (issue #25).

    trials: how the attempt ended (ending, timed_out), the time it was charged and took in all
    (charged_s, total_s) and had left (time_left_s), context handoffs, cached prompt tokens, where the
    cost came from, and the final grading's correct draws; attempts: the conditions it ran under;
    submissions: correct draws. Older rows get what their stored facts give: the ending from the
    message the trial ended with, correct draws from the judge record; the rest stays NULL.
    """
    db.execute("ALTER TABLE trials ADD COLUMN ending VARCHAR")
    db.execute("ALTER TABLE trials ADD COLUMN timed_out BOOLEAN")
    for column, kind in (("charged_s", "DOUBLE"), ("total_s", "DOUBLE"), ("time_left_s", "DOUBLE"),
                         ("n_handoffs", "INTEGER"), ("cached_tokens", "BIGINT"), ("cost_source", "VARCHAR"),
                         ("n_correct_draws", "INTEGER")):
        db.execute(f"ALTER TABLE trials ADD COLUMN {column} {kind}")
    db.execute("ALTER TABLE attempts ADD COLUMN conditions JSON")
    db.execute("ALTER TABLE submissions ADD COLUMN n_correct_draws INTEGER")
    db.execute("UPDATE submissions SET n_correct_draws = "
               "len(list_filter(CAST(json_extract(record, '$.draws[*].ok') AS BOOLEAN[]), lambda ok: ok)) "
               "WHERE record IS NOT NULL")
    db.execute("UPDATE trials SET ending = split_part(message, ':', 1) "
               "WHERE list_contains(?, split_part(message, ':', 1))", [list(ENDINGS)])
    db.execute("UPDATE trials SET timed_out = (ending = 'time') WHERE ending IS NOT NULL")
    db.execute("""UPDATE trials SET n_correct_draws = s.n_correct_draws FROM submissions s
                  WHERE s.attempt_id = trials.attempt_id AND s.kind = 'final'""")


@migration
def m004_skills_by_attempt(db: duckdb.DuckDBPyConnection) -> None:
    """A skill belongs to the attempt that wrote it [attempt_id], and records its length.

    Keyed by trial, a rerun solo that wrote no SKILL.md left its previous attempt's skill in place
    for the skill arm to receive (issue #25). Every attempt's skill is kept now; a trial's skill is
    the one its current attempt wrote (Store.skill). A row without an attempt id takes its trial's
    current attempt, else a 'legacy:' id that no attempt has.
    """
    db.execute("""
    CREATE TABLE skills_by_attempt (
        attempt_id VARCHAR PRIMARY KEY, model VARCHAR NOT NULL, trial_id VARCHAR NOT NULL,
        text VARCHAR NOT NULL, sha256 VARCHAR NOT NULL, n_chars INTEGER, n_words INTEGER,
        created_at TIMESTAMP NOT NULL)""")
    db.execute("""
    INSERT INTO skills_by_attempt
    SELECT coalesce(s.attempt_id, t.attempt_id, 'legacy:' || s.model || ':' || s.trial_id), s.model, s.trial_id,
           s.text, s.sha256, length(s.text), len(regexp_extract_all(s.text, '\\S+')), s.created_at
    FROM skills s LEFT JOIN trials t ON t.model = s.model AND t.trial_id = s.trial_id""")
    db.execute("DROP TABLE skills")
    db.execute("ALTER TABLE skills_by_attempt RENAME TO skills")


@migration
def m010_run_owner(db: duckdb.DuckDBPyConnection) -> None:
    """runs.owner_pid and runs.owner_start: with runs.host they name the process that runs a run, so that a
    later mkb can tell a run whose process was killed from one still under way (mkb/store/owner.py)."""
    db.execute("ALTER TABLE runs ADD COLUMN owner_pid INTEGER")
    db.execute("ALTER TABLE runs ADD COLUMN owner_start VARCHAR")


@migration
def m020_trials_dsl_share(db: duckdb.DuckDBPyConnection) -> None:
    """trials.dsl_share: the final grading's DSL share of device time (issue #24), filled from stored records."""
    db.execute("ALTER TABLE trials ADD COLUMN dsl_share DOUBLE")
    db.execute("""
    UPDATE trials SET dsl_share = TRY_CAST(json_extract(s.record, '$.details.dsl_share') AS DOUBLE)
    FROM submissions s
    WHERE s.attempt_id = trials.attempt_id AND s.kind = 'final'""")


@migration
def m030_eager_baselines(db: duckdb.DuckDBPyConnection) -> None:
    """eager_baselines: the eager reference's time per problem, GPU model and environment fingerprint (issue #27)."""
    db.execute("""
    CREATE TABLE eager_baselines (
        fingerprint VARCHAR PRIMARY KEY, problem_id VARCHAR NOT NULL, gpu VARCHAR NOT NULL, timing VARCHAR NOT NULL,
        scale VARCHAR NOT NULL, fingerprint_parts JSON, eager_ms DOUBLE NOT NULL, eager_device_ms DOUBLE,
        processes INTEGER NOT NULL, summary VARCHAR NOT NULL, eager_ms_each JSON, measured_by VARCHAR,
        created_at TIMESTAMP NOT NULL)""")


@migration
def m031_noise_floors(db: duckdb.DuckDBPyConnection) -> None:
    """noise_floors: the spread of repeated final gradings of one variant, written by mkb calibrate (issue #27)."""
    db.execute("""
    CREATE TABLE noise_floors (
        problem_id VARCHAR NOT NULL, dsl VARCHAR NOT NULL, gpu VARCHAR NOT NULL, timing VARCHAR NOT NULL,
        kernel VARCHAR NOT NULL, kernel_sha256 VARCHAR NOT NULL, repeats INTEGER NOT NULL,
        processes INTEGER NOT NULL, summary VARCHAR NOT NULL, speedups JSON, kernel_ms_each JSON,
        spread DOUBLE NOT NULL, created_at TIMESTAMP NOT NULL,
        PRIMARY KEY (problem_id, dsl, gpu, timing))""")
