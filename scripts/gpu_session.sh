#!/usr/bin/env bash
# One GPU session on the lent H200 (or an H100): run the named stages, write every record under $OUT. Every file
# named after the GPU below (h200.json, mkb-h200.duckdb, eager_h200.json, ...) takes the GPU's key instead of
# "h200" on another GPU (h100.json, mkb-h100.duckdb, ...): records of two GPUs never mix.
# Run from the repository root on the device machine, after the toolchains are installed:
#   bash scripts/gpu_session.sh qa solutions judge bench reference docs gpu-tests
# Stages that need more than one device call's 10 minutes run as one detached job (scripts/gpu_job.sh):
#   SOL_PROBLEMS=p28,p25 bash scripts/gpu_job.sh start solutions judge
# and back-to-back calls of `bash scripts/gpu_job.sh wait 540` keep the machine warm (a machine with no
# call for ~30 s is given back, with the job and its files) and pack the records into $OUT/job.tar.gz
# (a call brings back at most 8 files). A job started with a plain `&` dies with the call that started it.
# Stages (each writes its own files under $OUT; logs in $OUT/session.log):
#   qa         full-scale problem QA on the GPU (QA_FAMILY=moe for one family, QA_PROBLEMS=p38,p48 for some) -> qa_full.json, eager_h200.json
#   solutions  shipped solutions through the judge (SOL_PROBLEMS=p28,p25 SOL_DSL=tirx for a slice; SOL_PENDING=1
#              adds problems/solutions/pending/, not yet graded on a GPU) -> <gpu>.json (h200.json on the
#              H200, h100.json on an H100: the GPU names the records file)
#   ceilings   the GPU's speed-of-light ceilings (copy bandwidth, bf16/fp32 GEMM) -> ceilings_<gpu>.json
#   judge      pytest -m gpu tests/test_judge_gpu.py: valid kernels at full scale (paper, flushed), CPU hack
#              fixtures graded on the GPU                             -> judge_records.json (JUDGE_ONLY=pytest -k expression)
#   share      the DSL share (issue #24): the partial-DSL and GEMM-epilogue fixtures and the fused ones under both
#              DSL policies (pytest -k dsl_share)                      -> dsl_share_records.json; with
#              SHARE_SOLUTIONS=1 also every shipped solution graded under strict -> h200_strict.json (else
#              solutions_table.py re-scores the `solutions` stage's paper gradings, which record the share)
#   bench      judge overhead and timing spread (paper, flushed)    -> bench_judge_<problem>_<dsl>.json
#              (BENCH_MODES="paper" for one mode, BENCH_TAG=x to suffix the file names;
#              BENCH_CASES="p28:cutedsl:tests/kernels/gpu_cutedsl_p28.py p19:tirx:problems/solutions/tirx/p19.py";
#              BENCH_FINAL=1 for the final-grading mode)
#   calibrate  mkb calibrate on CAL_VARIANTS (default "p25:cutedsl p19:tirx p28:cutedsl p01:tirx"), CAL_REPEATS (3)
#              final gradings each of CAL_PROCESSES (default the setting, 5) fresh processes: floors and eager
#              baselines into mkb-h200.duckdb (resumed like reference)  -> calibrate_h200.json
#   regrade    mkb regrade of the oracle's final kernels in mkb-h200.duckdb (REGRADE_PROBLEMS=p19,p25 for a slice,
#              REGRADE_PROCESSES=3 for fewer processes per final grading),
#              in the final-grading mode, reusing calibrate's baselines -> regrade_h200.json, mkb-h200.duckdb
#   reference  the reference oracle protocol on REF_PROBLEMS, trials whose problem, templates or toolchain changed
#              run again (--rerun-stale)                              -> mkb-h200.duckdb (resumes the shipped
#              artifact/results/mkb-h200.duckdb unless REF_FRESH=1)
#   reproduce  `mkb reproduce` in its GPU form, the oracle on REF_PROBLEMS (resumes like reference): QA at
#              smoke (CPU) and full scale (GPU), protocol, report  -> mkb-h200.duckdb, eager_h200.json
#   ray        the reference oracle on RAY_PROBLEMS (RAY_ARMS="solo_cutedsl solo_tirx" for some arms)
#              through a local Ray instance (ray importable, e.g. from
#              PYTHONPATH), compared with the local executor's trials in mkb-h200.duckdb -> mkb-ray.duckdb,
#              ray_vs_local.json
#   docs       pytest -m gpu: the DSL manuals' examples on the GPU   -> docs_examples.json
#   gpu-tests  every @pytest.mark.gpu test (make test-gpu)          -> gpu_tests.log, judge_records.json,
#              docs_examples.json
#   anchors    external anchors (issue #20): installs the staged libraries apart (scripts/install_anchors.sh; carry
#              ".device/anchors" from scripts/stage_anchors.sh), then grades every artifact/anchors/<pid>_<lib>.py
#              as a trusted anchor and our shipped p28/p36 beside them (artifact/generators/anchors.py; ANCHOR_PROBLEMS=p36
#              for a slice, ANCHOR_OURS=none to grade the anchors alone)          -> anchors_<gpu>.json
#   repeat     solutions called again and again on the same inputs, bit for bit (races; REPEAT_VARIANTS, default
#              "p61:cutedsl p61:tirx"; REPEAT_CALLS, default 200)      -> repeat_check.json
#   sandbox    the judge's sandbox on the GPU: what CUDA IPC needs across it, every attack fixture graded
#              as CuTe DSL and TIRx, contained and leaving nothing -> sandbox_check.json
# Carry .device/extra (scripts/stage_runtime.sh) too: the project's runtime wheels the image lacks are installed first.
# Staging in three calls instead of five: scripts/stage_compact.sh (it prints the calls; its slim runtime set has no
# duckdb, so calibrate, regrade, reference, reproduce and ray need .device/extra carried as well).
# The judge grades only inside its bwrap sandbox: a bwrap staged with scripts/stage_bwrap.sh (carry
# ".device/bwrap") is installed first when the machine has none.
set -uo pipefail
OUT=${OUT:-/tmp/mkb-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" MKB_HOME=/tmp/mkb-home
PY=${PY:-python3}
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$OUT/session.log"; }
if ! command -v bwrap >/dev/null && [ -x .device/bwrap/bwrap ]; then
  install -m 0755 .device/bwrap/bwrap /usr/local/bin/bwrap
  if ldd /usr/local/bin/bwrap | grep -q "not found"; then cp .device/bwrap/*.so* /usr/local/lib/ && ldconfig; fi
fi
# The device image lacks some of the project's runtime wheels: staged with scripts/stage_runtime.sh, carry .device/extra.
if ! $PY -c "import pydantic, duckdb" 2>/dev/null; then
  if ls .device/extra/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile .device/extra/*.whl 2>&1 | tail -2 | tee -a "$OUT/session.log"
  else
    log "pydantic/duckdb missing and no .device/extra: stage them (bash scripts/stage_runtime.sh) and carry .device/extra"
  fi
fi
command -v bwrap >/dev/null && log "judge sandbox: $(bwrap --version)" \
  || log "NO bwrap: every grading is an infra_error (stage one: bash scripts/stage_bwrap.sh, carry .device/bwrap)"
# The oracle stages resume: $OUT's database if a stage made one, else the shipped one (unless REF_FRESH=1);
# finished trials in it are reused.
resume_db() {
  [ -n "${REF_FRESH:-}" ] || [ -f "$OUT/mkb-$GPU.duckdb" ] || [ ! -f artifact/results/mkb-$GPU.duckdb ] \
    || cp artifact/results/mkb-$GPU.duckdb "$OUT/mkb-$GPU.duckdb"
}
# The oracle stages (reference, reproduce, ray) run no agent commands: where bubblewrap cannot sandbox attempts
# on this machine, they may run unisolated (mkb refuses that unless MKB_UNSAFE_SANDBOX is set).
if ! bwrap --unshare-net --unshare-pid --ro-bind / / --proc /proc --dev /dev true 2>/dev/null; then
  export MKB_UNSAFE_SANDBOX=${MKB_UNSAFE_SANDBOX:-1}
  log "bubblewrap cannot run here: the oracle's attempts run unisolated (MKB_UNSAFE_SANDBOX=$MKB_UNSAFE_SANDBOX)"
fi
# The GPU's key names the solutions' records file (h200, h100): validate_solutions.gpu_key.
GPU=$($PY -c 'import sys, torch; sys.path.insert(0, "artifact/generators"); from validate_solutions import gpu_key
print(gpu_key(torch.cuda.get_device_name()) if torch.cuda.is_available() else "cpu")' 2>/dev/null || echo cpu)
log "GPU key: $GPU"
for stage in "$@"; do
  log "stage $stage"
  case $stage in
    qa) [ ! -f "problems/eager_$GPU.json" ] || cp "problems/eager_$GPU.json" "$OUT/eager_$GPU.json"   # other rows kept
        $PY -m mkb --db /tmp/mkb-home/qa.duckdb problems check ${QA_PROBLEMS//,/ } --scale full --device cuda --record --json \
          ${QA_FAMILY:+--family $QA_FAMILY} > "$OUT/qa_full.json" 2>> "$OUT/session.log"
        $PY artifact/generators/eager_table.py "$OUT/qa_full.json" "$OUT/eager_$GPU.json" 2>&1 | tee -a "$OUT/session.log" ;;
    solutions) [ -f "$OUT/$GPU.json" ] || [ ! -f "problems/solutions/$GPU.json" ] \
          || cp "problems/solutions/$GPU.json" "$OUT/$GPU.json"   # --merge keeps the others
        $PY artifact/generators/validate_solutions.py --out "$OUT/$GPU.json" ${SOL_PROBLEMS:+--problems "$SOL_PROBLEMS" --merge} \
          ${SOL_DSL:+--dsl "$SOL_DSL"} ${SOL_PENDING:+--pending} \
          2>&1 | tail -40 | tee -a "$OUT/session.log" ;;
    judge) $PY -m pytest -q -m gpu tests/test_judge_gpu.py --gpu-records "$OUT" ${JUDGE_ONLY:+-k "$JUDGE_ONLY"} \
          2>&1 | tail -40 | tee -a "$OUT/session.log" ;;
    share) $PY -m pytest -q -m gpu tests/test_judge_gpu.py --gpu-records "$OUT" -k dsl_share \
          2>&1 | tail -20 | tee -a "$OUT/session.log"
        if [ "${SHARE_SOLUTIONS:-0}" = 1 ]; then
          [ -f "$OUT/${GPU}_strict.json" ] || [ ! -f problems/solutions/${GPU}_strict.json ] \
            || cp problems/solutions/${GPU}_strict.json "$OUT/${GPU}_strict.json"
          $PY artifact/generators/validate_solutions.py --dsl-policy strict --out "$OUT/${GPU}_strict.json" \
            ${SOL_PROBLEMS:+--problems "$SOL_PROBLEMS" --merge} ${SOL_DSL:+--dsl "$SOL_DSL"} \
            2>&1 | tail -30 | tee -a "$OUT/session.log"
        fi ;;
    bench) for case in ${BENCH_CASES:-p28:cutedsl:tests/kernels/gpu_cutedsl_p28.py}; do
          IFS=: read -r problem dsl kernel <<< "$case"
          $PY -m mkb bench judge "$problem" "$kernel" --dsl "$dsl" --repeats "${BENCH_REPEATS:-5}" --json \
            ${BENCH_MODES:+$(printf -- '--mode %s ' $BENCH_MODES)} ${BENCH_FINAL:+--final} \
            > "$OUT/bench_judge_${problem}_${dsl}${BENCH_TAG:+_$BENCH_TAG}.json" 2>> "$OUT/session.log"
          log "bench $case exit $?"
        done ;;
    calibrate) resume_db
        $PY -m mkb --db "$OUT/mkb-$GPU.duckdb" calibrate ${CAL_VARIANTS:-p25:cutedsl p19:tirx p28:cutedsl p01:tirx} \
          --repeats "${CAL_REPEATS:-3}" ${CAL_PROCESSES:+--processes "$CAL_PROCESSES"} --json \
          > "$OUT/calibrate_$GPU.json" 2>> "$OUT/session.log"
        log "calibrate exit $?" ;;
    regrade) resume_db
        $PY -m mkb --db "$OUT/mkb-$GPU.duckdb" regrade --models reference ${REGRADE_PROBLEMS:+--problems "$REGRADE_PROBLEMS"} \
          ${REGRADE_PROCESSES:+--processes "$REGRADE_PROCESSES"} \
          --json > "$OUT/regrade_$GPU.json" 2>> "$OUT/session.log"
        log "regrade exit $?" ;;
    reference) resume_db
        $PY -m mkb --db "$OUT/mkb-$GPU.duckdb" run-model reference --problems "${REF_PROBLEMS:-p28,p25}" --rerun-stale \
          --device cuda --concurrency "${REF_CONCURRENCY:-2}" 2>&1 | tail -30 | tee -a "$OUT/session.log" ;;
    reproduce) resume_db
        $PY -m mkb --db "$OUT/mkb-$GPU.duckdb" reproduce --problems "${REF_PROBLEMS:-p28,p25}" 2>&1 \
          | tee "$OUT/reproduce.log" | tail -40 | tee -a "$OUT/session.log"
        [ -f "$OUT/eager_$GPU.json" ] || [ ! -f "problems/eager_$GPU.json" ] || cp "problems/eager_$GPU.json" "$OUT/eager_$GPU.json"
        $PY artifact/generators/eager_table.py "$OUT/mkb-$GPU.duckdb" "$OUT/eager_$GPU.json" 2>&1 | tee -a "$OUT/session.log" ;;
    ray) $PY -m mkb --db "$OUT/mkb-ray.duckdb" run-model reference --problems "${RAY_PROBLEMS:-p28}" --device cuda \
          $(for a in ${RAY_ARMS:-}; do echo --arms "$a"; done) --executor ray --concurrency "${REF_CONCURRENCY:-2}" \
          2>&1 | tee "$OUT/ray.log" | tail -30 | tee -a "$OUT/session.log"
        $PY artifact/generators/ray_compare.py "$OUT/mkb-$GPU.duckdb" "$OUT/mkb-ray.duckdb" > "$OUT/ray_vs_local.json" \
          2>> "$OUT/session.log"
        tail -c 600 "$OUT/ray_vs_local.json" | tee -a "$OUT/session.log" ;;
    docs) $PY -m pytest -q -m gpu tests/test_docs.py --gpu-records "$OUT" 2>&1 | tail -20 | tee -a "$OUT/session.log" ;;
    gpu-tests) $PY -m pytest -q -m gpu --gpu-records "$OUT" 2>&1 | tee "$OUT/gpu_tests.log" | tail -40 \
          | tee -a "$OUT/session.log" ;;
    ceilings) $PY artifact/generators/measure_ceilings.py "$OUT/ceilings_$GPU.json" 2>&1 | tee -a "$OUT/session.log" ;;
    anchors) bash scripts/install_anchors.sh "${ANCHOR_WHEELS:-.device/anchors}" 2>&1 | tee -a "$OUT/session.log"
        [ -f "$OUT/anchors_$GPU.json" ] || [ ! -f "problems/solutions/anchors_$GPU.json" ] \
          || cp "problems/solutions/anchors_$GPU.json" "$OUT/anchors_$GPU.json"   # --merge keeps the others
        $PY artifact/generators/anchors.py --out "$OUT/anchors_$GPU.json" --merge \
          ${ANCHOR_PROBLEMS:+--problems "$ANCHOR_PROBLEMS"} ${ANCHOR_OURS:+--ours "$ANCHOR_OURS"} \
          2>&1 | tail -30 | tee -a "$OUT/session.log" ;;
    repeat) $PY scripts/gpu_repeat_check.py "$OUT/repeat_check.json" ${REPEAT_VARIANTS:-p61:cutedsl p61:tirx} \
          --calls "${REPEAT_CALLS:-200}" 2>&1 | tail -20 | tee -a "$OUT/session.log" ;;
    sandbox) $PY scripts/gpu_sandbox_check.py "$OUT/sandbox_check.json" 2>&1 | tail -60 | tee -a "$OUT/session.log" ;;
    *) log "unknown stage $stage"; exit 2 ;;
  esac
  log "stage $stage exit ${PIPESTATUS[0]}"
done
