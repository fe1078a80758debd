#!/usr/bin/env bash
# Build the real Dockerfile on a local base image and run `mkb doctor` and the CPU tests inside it,
# with no network. Starts a Docker engine if none answers and stops the one it started.
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
# The security options let the image's bubblewrap sandbox the attempts the tests run (README: $SANDBOX).
run=(docker run --rm --network none --memory 6g --cpus 2 --pids-limit 512 --security-opt seccomp=unconfined
     --security-opt apparmor=unconfined --security-opt systempaths=unconfined)
"${run[@]}" "$TAG" doctor
"${run[@]}" --entrypoint python "$TAG" -m pytest -q -p no:cacheprovider \
  tests/test_problems.py tests/test_store.py tests/test_cli.py tests/test_doctor.py tests/test_protocol.py \
  tests/test_sandbox.py
