#!/usr/bin/env bash
# Install the staged anchor wheels (scripts/stage_anchors.sh) into a site directory of their own:
#   bash scripts/install_anchors.sh [WHEEL_DIR]     (default .device/anchors)
# -> $MKB_ANCHOR_ROOT/quack-kernels-<version>/site-packages (default root /opt/mkb-anchors), outside every
# site-packages the judge's interpreter imports from: an ordinary grading's cell does not contain it; only an
# anchor grading (artifact/generators/anchors.py, mkb.judge.anchor) shows it to its candidate. A wheel is a zip:
# unpacking it is its install (pure Python, and one extension that loads only on torch <= 2.9).
set -euo pipefail
WHEELS=${1:-.device/anchors}
ROOT=${MKB_ANCHOR_ROOT:-/opt/mkb-anchors}
PY=${PY:-python3}
[ -f "$WHEELS/SHA256SUMS" ] || { echo "no staged anchors in $WHEELS: run bash scripts/stage_anchors.sh here and carry .device/anchors" >&2; exit 3; }
(cd "$WHEELS" && sha256sum -c --quiet SHA256SUMS)
quack=$(ls "$WHEELS"/quack_kernels-*.whl | head -1)
version=$(basename "$quack" | cut -d- -f2)
SITE="$ROOT/quack-kernels-$version/site-packages"
if [ -f "$SITE/.installed" ] && cmp -s "$SITE/.installed" "$WHEELS/SHA256SUMS"; then
  echo "anchors already installed in $SITE"; exit 0
fi
rm -rf "$SITE" && mkdir -p "$SITE"
for w in "$WHEELS"/*.whl; do "$PY" -m zipfile -e "$w" "$SITE"; done
cp "$WHEELS/SHA256SUMS" "$SITE/.installed"
chmod -R a+rX "$ROOT"
echo "anchors installed in $SITE: $(cd "$SITE" && ls -d *.dist-info | sed 's/.dist-info//' | tr '\n' ' ')"
