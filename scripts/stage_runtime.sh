#!/usr/bin/env bash
# Stage the project's runtime wheels that the lent GPU machine's image lacks (pydantic, duckdb, openai, docker,
# pytest, ...: the image has torch, numpy, click, rich, jinja2, matplotlib but reaches no package registry).
#   bash scripts/stage_runtime.sh      -> .device/extra/ (wheels for the device's Python 3.12, x86-64)
# Carry ".device/extra" with a device call; scripts/gpu_session.sh installs them when pydantic is missing.
# The list: pyproject.toml's dependencies and dev extras, less the toolchains (staged by
# ../shared/device/stage-toolchains.sh) and less what ../shared/device/device-image-packages.txt says the image has;
# pip resolves their own dependencies, and those the image has are dropped the same way.
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE=../shared/device/device-image-packages.txt
[ -f "$IMAGE" ] || { echo "no $IMAGE: cannot tell what the device image has" >&2; exit 1; }
grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >> "$(git rev-parse --git-common-dir)/info/exclude"
norm() { tr 'A-Z_.' 'a-z--'; }
mapfile -t WANT < <(python3 - <<'PY'
import re, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
skip = ("torch", "nvidia-cutlass-dsl", "apache-tvm")
for req in project["dependencies"] + project["optional-dependencies"]["dev"]:
    name = re.split(r"[\[<>=!~ ;]", req, maxsplit=1)[0]
    if not name.lower().startswith(skip):
        print(req)
PY
)
TODO=()
for req in "${WANT[@]}"; do
  name=$(echo "$req" | sed 's/[[<>=!~ ;].*//' | norm)
  grep -qx "$name" "$IMAGE" || TODO+=("$req")
done
rm -rf .device/extra.tmp && mkdir -p .device/extra.tmp
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .device/extra.tmp "${TODO[@]}" 2>&1 | grep -v "is ignored" || true
rm -rf .device/extra && mkdir -p .device/extra
for w in .device/extra.tmp/*.whl; do
  name=$(basename "$w" | cut -d- -f1 | norm)
  grep -qx "$name" "$IMAGE" || cp "$w" .device/extra/
done
rm -rf .device/extra.tmp
ls .device/extra/*.whl >/dev/null 2>&1 || { echo "no wheels staged" >&2; exit 1; }
echo "staged $(ls .device/extra | wc -l) wheels ($(du -sh .device/extra | cut -f1)) in .device/extra for: ${TODO[*]}"
