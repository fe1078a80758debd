#!/usr/bin/env bash
# Run scripts/gpu_session.sh stages as one job that outlives a device call, and bring its records back.
#   bash scripts/gpu_job.sh start solutions judge    # env as for gpu_session.sh (SOL_PROBLEMS=..., ...)
#   bash scripts/gpu_job.sh wait 540                 # poll until the job ends or 540 s pass; pack $OUT
#   bash scripts/gpu_job.sh status
# Why: a device call lasts at most 10 minutes and the machine is given back after ~30 s with no call in
# flight, so long stage lists run detached (setsid: a job in the call's process group dies with the call)
# while back-to-back `wait` calls keep the machine warm. A call brings back at most 8 files from $OUT, so
# `wait` packs the whole job directory into one tarball ($OUT/job.tar.gz) beside the session log's tail.
# A second `start` while a job runs is refused; jobs run one after another in the same directory
# (JOB=/tmp/mkb-job), so the stages' records (h200.json, judge_records.json, ...) accumulate there.
set -uo pipefail
JOB=${JOB:-/tmp/mkb-job}
mkdir -p "$JOB"
running() { [ -f "$JOB/pid" ] && kill -0 "$(cat "$JOB/pid")" 2>/dev/null; }
case ${1:-} in
  start)
    shift
    if running; then echo "a job is running (pid $(cat "$JOB/pid")): wait for it first" >&2; exit 2; fi
    [ $# -gt 0 ] || { echo "name the stages: bash scripts/gpu_job.sh start solutions judge" >&2; exit 2; }
    rm -f "$JOB/exit"
    OUT=$JOB setsid bash -c 'bash scripts/gpu_session.sh "$@"; echo $? > "$OUT/exit"' _ "$@" \
      >> "$JOB/job.log" 2>&1 < /dev/null &
    echo $! > "$JOB/pid"
    echo "started: $* (pid $!, records in $JOB)" ;;
  wait)
    limit=${2:-540}
    start=$SECONDS
    while running && [ $((SECONDS - start)) -lt "$limit" ]; do sleep 5; done
    if running; then echo "still running after ${limit}s"; else echo "job ended (exit $(cat "$JOB/exit" 2>/dev/null || echo '?'))"; fi
    if [ -n "${OUT:-}" ] && [ "$OUT" != "$JOB" ]; then
      tar -czf "$OUT/job.tar.gz" --exclude="*.duckdb.wal" -C "$(dirname "$JOB")" "$(basename "$JOB")" \
        && tail -40 "$JOB/session.log" > "$OUT/session_tail.log" 2>/dev/null
    fi
    tail -20 "$JOB/session.log" 2>/dev/null ;;
  status)
    if running; then echo "running (pid $(cat "$JOB/pid"))"; else echo "idle (last exit $(cat "$JOB/exit" 2>/dev/null || echo none))"; fi
    tail -5 "$JOB/session.log" 2>/dev/null ;;
  *) echo "usage: bash scripts/gpu_job.sh start STAGE... | wait [SECONDS] | status" >&2; exit 2 ;;
esac
