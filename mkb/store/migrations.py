"""The results database's schema as numbered migrations: each applied once, in order, and recorded.

A change to the schema is a new function at the end, decorated with @migration and named
mNNN_what_it_does; the Store applies the ones a file lacks when it opens it (in memory for a read-only
open). A new column also goes into its record in mkb/store/rows.py.
"""

from __future__ import annotations

from collections.abc import Callable

import duckdb

MIGRATIONS: list[Callable[[duckdb.DuckDBPyConnection], None]] = []
migration = MIGRATIONS.append


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


@migration
def m020_trials_dsl_share(db: duckdb.DuckDBPyConnection) -> None:
    """trials.dsl_share: the final grading's DSL share of device time (issue #24), filled from stored records."""
    db.execute("ALTER TABLE trials ADD COLUMN dsl_share DOUBLE")
    db.execute("""
    UPDATE trials SET dsl_share = TRY_CAST(json_extract(s.record, '$.details.dsl_share') AS DOUBLE)
    FROM submissions s
    WHERE s.attempt_id = trials.attempt_id AND s.kind = 'final'""")
