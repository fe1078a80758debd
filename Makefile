# MetaKernelBench. The two commands a newcomer runs: `make reproduce` and `make test`.
# Each sets itself up (virtual environment, installs) when needed.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
MKB    := $(VENV)/bin/mkb
STAMP  := $(VENV)/.installed

.PHONY: install test test-gpu test-ray reproduce image image-test clean help

help:
	@echo "make reproduce   validate the problems, run what this machine can, write tables (main job)"
	@echo "make test        run the CPU test suite (GPU tests skip without a GPU)"
	@echo "make test-ray    install the optional ray extra and run the Ray executor tests (local Ray, CPU)"
	@echo "make install     create $(VENV) and install mkb with its pinned dependencies"
	@echo "make image       build the production Docker image (mkb:latest)"
	@echo "make image-test  build the image on a local base and run doctor + CPU tests inside (CI)"

install: $(STAMP)

# Everything but torch comes from requirements.lock (hash-pinned, shared with the Docker image;
# regenerate with scripts/lock.sh). torch's build is chosen per machine: TORCH_SPEC (default the
# CPU wheel these machines carry; a GPU machine sets e.g. TORCH_SPEC='torch==2.11.0'). torch comes with its
# own dependencies (a CUDA build needs its nvidia-* runtime wheels); the lock then pins the shared ones.
$(STAMP): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "$${TORCH_SPEC:-torch==2.13.0}"
	$(PY) -m pip install -q --require-hashes --no-deps -r requirements.lock
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	$(PY) -m pip check
	$(MKB) docs build
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

test-gpu: $(STAMP)
	$(PY) -m pytest -q -m gpu

# Ray is an optional extra: requirements-ray.lock pins it and its dependencies with hashes (the rest as in
# requirements.lock; scripts/lock.sh writes both). CI runs these after `make test`.
test-ray: $(STAMP)
	$(PY) -m pip install -q --require-hashes --no-deps -r requirements-ray.lock
	$(PY) -m pip check
	$(PY) -m pytest -q -m ray tests/test_ray.py

reproduce: $(STAMP)
	$(MKB) reproduce $(if $(MODEL),--model $(MODEL)) $(if $(PROBLEMS),--problems '$(PROBLEMS)')

# The production image: CUDA 13 devel base pinned by digest, Python 3.12, wheels from requirements.lock.
image:
	scripts/wheelhouse.sh 3.12 "$${TORCH_SPEC:-torch==2.11.0}"
	docker build --network host --build-arg TORCH_SPEC="$${TORCH_SPEC:-torch==2.11.0}" -t mkb:latest .

# What CI runs: the same Dockerfile on a local Debian base, doctor + CPU tests inside, no network.
image-test:
	scripts/image-test.sh

clean:
	rm -rf $(VENV) results build .pytest_cache
