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

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first: a plain 'pip install torch' would pull a multi-GB CUDA build on CPU machines;
	# TORCH_SPEC lets a GPU machine choose its own build.
	$(PY) -m pip install -q "$${TORCH_SPEC:-torch==2.13.0}"
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

test-gpu: $(STAMP)
	$(PY) -m pytest -q -m gpu

reproduce: $(STAMP)
	$(MKB) reproduce

clean:
	rm -rf $(VENV) results build .pytest_cache
