#!/usr/bin/env bash
# Fill build/wheelhouse with every wheel the image installs: torch (TORCH_SPEC, with its own
# dependencies) and everything in requirements.lock (hash-checked), for the image's Python.
#   scripts/wheelhouse.sh 3.12 torch==2.11.0     # production (CUDA base, Python 3.12)
#   scripts/wheelhouse.sh 3.11 torch==2.13.0     # CI (local Debian bookworm base, Python 3.11)
set -euo pipefail
cd "$(dirname "$0")/.."
PY_VER=${1:-3.12}
TORCH_SPEC=${2:-torch==2.11.0}
OUT=build/wheelhouse
mkdir -p "$OUT"
plat=(--only-binary=:all: --python-version "$PY_VER" --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform linux_x86_64)
python3 -m pip download -q "${plat[@]}" -d "$OUT" "$TORCH_SPEC" 2>&1 | grep -v "is ignored" || true
python3 -m pip download -q "${plat[@]}" --no-deps --require-hashes -r requirements.lock -d "$OUT" 2>&1 \
  | grep -v "is ignored" || true
ls "$OUT"/torch-* >/dev/null 2>&1 || { echo "no torch wheel for $TORCH_SPEC / Python $PY_VER" >&2; exit 1; }
echo "wheelhouse: $(ls "$OUT" | wc -l) wheels, $(du -sh "$OUT" | cut -f1)"
