# The verbs a person types. Each one installs what it needs first (uv, then the locked env).
SHELL := /bin/bash
TOOLS := $(HOME)/.cache/tokenmill/tools
UV := $(shell command -v uv 2>/dev/null || echo $(TOOLS)/bin/uv)
RUN := $(UV) run --locked

.PHONY: env test test-fast lint demo bench clean

$(TOOLS)/bin/uv:
	python3 -m venv $(TOOLS)
	$(TOOLS)/bin/pip install --quiet uv

env: $(if $(shell command -v uv 2>/dev/null),,$(TOOLS)/bin/uv)
	$(UV) sync --locked

# Both cores (at most 4 workers), a test file per worker at a time: each worker starts its own
# broker and Jaeger on free ports, so files stay independent.
test: env
	$(RUN) pytest -n auto --maxprocesses 4 --dist loadfile

# The inner loop, a few minutes: unit tests that load no model (tests/conftest.py marks the ones
# that do) and are not marked slow; no broker, no Jaeger. `make test` still runs everything.
test-fast: env
	$(RUN) pytest tests/unit -m "not slow and not model" -q

lint: env
	$(RUN) ruff check .
	$(RUN) ruff format --check .
	$(RUN) mypy actors gpu messages ops

demo: env
	RUN="$(RUN)" ops/demo.sh

bench: env
	$(RUN) tokenmill bench engine --model smollm2-135m --requests 64 --out docs/results/
	$(RUN) tokenmill bench pipeline --model smollm2-135m --out docs/results/
	$(RUN) tokenmill bench batch --out docs/results/

clean:
	rm -rf .venv .pytest_cache .mypy_cache .ruff_cache
