#!/usr/bin/env bash
# Build the real Dockerfile on a local base image and run `mkb doctor`, the CPU tests and the judge's sandbox
# attacks inside it (as its non-root user, with the documented --security-opt flags), with no network.
# Starts a Docker engine if none answers and stops the one it started.
#   scripts/image-test.sh            (CI: .ci/run calls it; needs root for the engine)
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${BASE_IMAGE:-local/debian:bookworm}
TAG=${IMAGE_TAG:-mkb:ci}
command -v dockerd >/dev/null || scripts/dockerd.sh install
started=$(scripts/dockerd.sh start)
trap '[ "$started" = started ] && scripts/dockerd.sh stop >/dev/null' EXIT
BASE_IMAGE=$BASE scripts/dockerd.sh base-image
scripts/wheelhouse.sh 3.11 torch==2.13.0
docker build -q --network host --build-arg BASE="$BASE" --build-arg TORCH_SPEC=torch==2.13.0 -t "$TAG" . >/dev/null
echo "built $TAG"
run=(docker run --rm --network none --memory 6g --cpus 2 --pids-limit 512)
# Both sandboxes (the attempts' and the judge's) need namespaces, which Docker's defaults refuse: the
# documented flags (README's $SANDBOX, Dockerfile).
sandboxed=("${run[@]}" --security-opt seccomp=unconfined --security-opt apparmor=unconfined
           --security-opt systempaths=unconfined)
"${sandboxed[@]}" "$TAG" doctor
# Without the flags: doctor names the judge sandbox as failed with the fix, and a grading is an infra_error.
doctor=$("${run[@]}" "$TAG" doctor --json 2>/dev/null || true)
python3 -c 'import json, sys; rows = {r["component"]: r["state"] for r in json.load(sys.stdin)}
sys.exit(rows.get("judge sandbox") != "fail")' <<< "$doctor" || { echo "doctor did not fail the judge sandbox" >&2; exit 1; }
graded=$("${run[@]}" "$TAG" verify p28 --dsl cutedsl tests/kernels/valid_torch_p28.py --device cpu --scale smoke --json \
  2>/dev/null || true)
grep -q '"status": "infra_error"' <<< "$graded" || { echo "a grading without a sandbox was not an infra_error" >&2; exit 1; }
echo "without the flags: doctor fails the judge sandbox, a grading is an infra_error"
"${sandboxed[@]}" --entrypoint python "$TAG" -m pytest -q -p no:cacheprovider \
  tests/test_problems.py tests/test_store.py tests/test_cli.py tests/test_doctor.py tests/test_protocol.py \
  tests/test_sandbox.py tests/test_judge_sandbox.py
