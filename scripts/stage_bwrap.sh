#!/usr/bin/env bash
# Stage this machine's bubblewrap for the lent GPU machine, whose image has util-linux but no bwrap and
# reaches no package registry. The judge grades every kernel in a bwrap sandbox (docs/judge.md).
#   bash scripts/stage_bwrap.sh        -> .device/bwrap/ (bwrap and the libraries it links, libc aside)
# Carry ".device/bwrap" with the first device call; scripts/gpu_session.sh installs it when bwrap is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
BWRAP=$(command -v bwrap) || { echo "bwrap is not installed here: apt-get install bubblewrap" >&2; exit 1; }
grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >> "$(git rev-parse --git-common-dir)/info/exclude"
rm -rf .device/bwrap && mkdir -p .device/bwrap
cp "$BWRAP" .device/bwrap/bwrap
for lib in $(ldd "$BWRAP" | awk '/=>/{print $3}'); do
  case "$lib" in */libc.so*|*/ld-linux*) ;; *) cp "$lib" .device/bwrap/ ;; esac
done
echo "staged $("$BWRAP" --version) in .device/bwrap: $(ls .device/bwrap | tr '\n' ' ')"
