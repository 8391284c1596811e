# `make run`: set up and start exo-tui on the bundled demo model. `make test`: set up and run the tests.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: run test lint typecheck bench bench-kernels bench-moe screenshots clean

# The CPU kernels (engine/kernels) compile at install: editing them reinstalls.
KERNEL_SOURCES := setup.py engine/kernels/CMakeLists.txt $(wildcard engine/kernels/csrc/*)

$(VENV)/.base: pyproject.toml $(KERNEL_SOURCES)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.dev: $(VENV)/.base
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

$(VENV)/.bench: $(VENV)/.dev
	$(PY) -m pip install -q -e '.[dev,bench]'
	touch $@

run: $(VENV)/.base
	$(VENV)/bin/exo-tui

test: $(VENV)/.dev
	$(PY) -m pytest

lint: $(VENV)/.dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(VENV)/.dev
	$(VENV)/bin/pyright

bench: $(VENV)/.dev
	$(PY) bench/engine_vs_mlx_lm.py

# The CPU kernels against plain mlx-lm and llama.cpp (built once by bench/llama_cpp.py).
bench-kernels: $(VENV)/.bench
	$(PY) bench/cpu_kernels.py

# Mixtures of experts (Qwen3-30B-A3B's and gpt-oss-20b's shapes, full depth: ~58 GB of disk the
# first time) against plain mlx-lm and llama.cpp; options in MOE_ARGS, e.g. MOE_ARGS="--layers 8".
bench-moe: $(VENV)/.bench
	$(PY) bench/moe.py $(MOE_ARGS)

screenshots: $(VENV)/.dev
	$(PY) scripts/screenshots.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
