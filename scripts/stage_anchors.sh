#!/usr/bin/env bash
# Stage the external anchors' libraries (issue #20: published kernels graded beside ours) for the GPU machine,
# which has torch and, once the toolchains are installed, nvidia-cutlass-dsl and apache-tvm-ffi, but reaches no
# package registry. Run here, where pip reaches one:
#   bash scripts/stage_anchors.sh        -> .device/anchors/ (the wheels below, pinned, with SHA256SUMS)
# Carry ".device/anchors" with the device call that runs the `anchors` stage of scripts/gpu_session.sh, which
# installs them with scripts/install_anchors.sh. Not ../shared/device/stage-toolchains.sh's extras: those go
# into the image's site-packages, which every grading's cell shows, so an agent's kernel could import them.
# Pinned: quack-kernels 0.6.5 and the dependencies of it that neither the image (torch) nor the toolchains
# (nvidia-cutlass-dsl 4.8.1, apache-tvm-ffi 0.1.15.post2) provide; einops is in the image too, but pinned here
# so the anchor's environment is exact.
set -euo pipefail
cd "$(dirname "$0")/.."
PY_VER=${PY_VER:-3.12}   # the device image's python3
PKGS=("quack-kernels==0.6.5" "torch-c-dlpack-ext==0.1.5" "einops==0.8.2")
grep -qx '/.device/' "$(git rev-parse --git-common-dir)/info/exclude" 2>/dev/null \
  || echo '/.device/' >> "$(git rev-parse --git-common-dir)/info/exclude"
rm -rf .device/anchors && mkdir -p .device/anchors
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_VER" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .device/anchors "${PKGS[@]}" 2>&1 | grep -v "is ignored" || true
[ "$(ls .device/anchors/*.whl 2>/dev/null | wc -l)" = "${#PKGS[@]}" ] || { echo "download failed" >&2; exit 1; }
(cd .device/anchors && sha256sum ./*.whl > SHA256SUMS)
cp scripts/install_anchors.sh .device/anchors/
echo "staged in .device/anchors ($(du -sh .device/anchors | cut -f1)):"; cat .device/anchors/SHA256SUMS
