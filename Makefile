# MetaKernelBench. The two commands a newcomer runs: `make reproduce` and `make test`.
# Each sets itself up (virtual environment, installs) when needed.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
MKB    := $(VENV)/bin/mkb
STAMP  := $(VENV)/.installed

.PHONY: install test test-gpu reproduce clean help

help:
	@echo "make reproduce   validate the problems, run what this machine can, write tables (main job)"
	@echo "make test        run the CPU test suite (GPU tests skip without a GPU)"
	@echo "make install     create $(VENV) and install mkb with its pinned dependencies"

install: $(STAMP)

# Everything but torch comes from requirements.lock (hash-pinned, shared with the Docker image;
# regenerate with scripts/lock.sh). torch's build is chosen per machine: TORCH_SPEC (default the
# CPU wheel these machines carry; a GPU machine sets e.g. TORCH_SPEC='torch==2.11.0').
$(STAMP): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --no-deps "$${TORCH_SPEC:-torch==2.13.0}"
	$(PY) -m pip install -q --require-hashes --no-deps -r requirements.lock
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	$(PY) -m pip check
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

test-gpu: $(STAMP)
	$(PY) -m pytest -q -m gpu

reproduce: $(STAMP)
	$(MKB) reproduce

clean:
	rm -rf $(VENV) results build .pytest_cache
