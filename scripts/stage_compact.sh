#!/usr/bin/env bash
# Stage the GPU toolchains in three device calls instead of five (a start that takes minutes and machines that go
# back after ~30 s idle make every call count).
#   bash scripts/stage_compact.sh       -> .device/q0 q1 q2 (toolchain parts), .device/tools31, .device/xslim
# Needs what ../shared/device/stage-toolchains.sh, scripts/stage_runtime.sh and scripts/stage_bwrap.sh staged
# (their cache, .device/tools, .device/extra, .device/bwrap). The same unpacked toolchains are compressed harder
# (zstd --ultra -22 --long=31: 131 MB against 156 MB at -12 --long=27, measured 2026-12-08; about 7 minutes on 2
# CPUs), split so that a part and the tracked work tree (~18 MB) fit one call's 64 MiB, and installed by a copy
# of the staged install.sh that decompresses with --long=31. xslim is .device/extra without duckdb (25 MB): the
# judge, solutions, repeat, sandbox and plain bench stages never import it; calibrate, regrade, reference,
# reproduce and ray do (carry .device/extra for those).
# The calls it prints, back to back:
#   1. carry [".device/q0"]   2. carry [".device/q1"]
#   3. carry [".device/q2", ".device/tools31", ".device/bwrap", ".device/xslim"]: install, then start a job.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=$(ls -d "${XDG_CACHE_HOME:-$HOME/.cache}"/mkb-device/*/ 2>/dev/null | head -1)
[ -n "$CACHE" ] && [ -f "$CACHE/done" ] && [ -d "$CACHE/site/mkb-site" ] \
  || { echo "no staged toolchains: run bash ../shared/device/stage-toolchains.sh first" >&2; exit 1; }
for d in .device/tools .device/extra .device/bwrap; do
  [ -d "$d" ] || { echo "no $d: run ../shared/device/stage-toolchains.sh, scripts/stage_runtime.sh, scripts/stage_bwrap.sh" >&2; exit 1; }
done
ARCHIVE="$CACHE/site22.tar.zst"
if [ ! -f "$ARCHIVE" ]; then
  tar -cf - -C "$CACHE/site" mkb-site | zstd -q --ultra -22 --long=31 -T0 -o "$ARCHIVE.tmp"
  mv "$ARCHIVE.tmp" "$ARCHIVE"
fi
TREE=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
SLIM=$(du -cb .device/bwrap .device/tools $(ls .device/extra/*.whl | grep -v duckdb) | tail -1 | cut -f1)
LIMIT=$(( 64 * 1024 * 1024 - TREE - 1024 * 1024 ))   # a call carries the tracked tree too; 1 MiB to spare
SIZE=$(stat -c %s "$ARCHIVE")
LAST=$(( SIZE - 2 * LIMIT ))                          # parts 1 and 2 full, the rest beside tools, bwrap and xslim
[ "$LAST" -le $(( LIMIT - SLIM )) ] || { echo "the archive ($SIZE B) does not fit 3 calls of $LIMIT B" >&2; exit 1; }
rm -rf .device/q0 .device/q1 .device/q2 .device/q.tmp .device/tools31 .device/xslim
mkdir -p .device/q.tmp && (cd .device/q.tmp && split -b "$LIMIT" -d "$ARCHIVE" part.)
for i in 0 1 2; do mkdir -p ".device/q$i" && mv ".device/q.tmp/part.0$i" ".device/q$i/"; done
rmdir .device/q.tmp
cp -r .device/tools .device/tools31 && sed -i 's/--long=27/--long=31/' .device/tools31/install.sh
mkdir -p .device/xslim && for w in .device/extra/*.whl; do case $w in *duckdb*) ;; *) cp "$w" .device/xslim/ ;; esac; done
echo "Staged 3 parts ($(du -sh "$ARCHIVE" | cut -f1)). Device calls, back to back:"
echo '  1. carry [".device/q0"]  command: mkdir -p /tmp/mkb-parts && rm -f /tmp/mkb-parts/part.* && cp .device/q0/part.* /tmp/mkb-parts/'
echo '  2. carry [".device/q1"]  command: cp .device/q1/part.* /tmp/mkb-parts/'
echo '  3. carry [".device/q2", ".device/tools31", ".device/bwrap", ".device/xslim"]  command: cp .device/q2/part.* /tmp/mkb-parts/'
echo '     && bash .device/tools31/install.sh && mkdir -p .device/extra && cp .device/xslim/*.whl .device/extra/'
echo '     && export PYTHONPATH=$PWD && <env> bash scripts/gpu_job.sh start <stages> && bash scripts/gpu_job.sh wait 420'
