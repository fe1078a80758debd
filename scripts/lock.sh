#!/usr/bin/env bash
# Regenerate requirements.lock: every dependency of mkb (and its dev extra) pinned with sha256 hashes,
# for Python 3.11 and 3.12 on Linux, shared by `make install` and the Docker image's wheelhouse; and
# requirements-ray.lock: the same plus the ray extra, constrained to requirements.lock (`make test-ray`).
# torch is the one exception: its build (CPU or a CUDA flavour) is chosen per machine with TORCH_SPEC,
# so torch itself, its CUDA runtime wheels and triton are left out of the lock.
set -euo pipefail
cd "$(dirname "$0")/.."
UV=${UV:-uv}
command -v "$UV" >/dev/null || { python3 -m venv /tmp/mkb-uv && /tmp/mkb-uv/bin/pip install -q uv && UV=/tmp/mkb-uv/bin/uv; }
exclude=(torch triton cuda-toolkit)
for p in nvidia-cublas nvidia-cuda-cccl nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 \
         nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 \
         nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx pywin32 colorama; do exclude+=("$p"); done
args=()
for p in "${exclude[@]}"; do args+=(--no-emit-package "$p"); done
"$UV" pip compile pyproject.toml --extra dev --universal --python-version 3.11 \
  --generate-hashes --no-header "${args[@]}" -o requirements.lock
"$UV" pip compile pyproject.toml --extra dev --extra ray --universal --python-version 3.11 -c requirements.lock \
  --generate-hashes --no-header "${args[@]}" -o requirements-ray.lock
echo "wrote requirements.lock ($(grep -c '==' requirements.lock) pins), requirements-ray.lock ($(grep -c '==' requirements-ray.lock) pins)"
