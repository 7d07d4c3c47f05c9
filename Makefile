# Plain entry points: `make demo` (the main job, on the emulator) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup demo test lint typecheck unit e2e proto bench fmt clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: setup
	$(BIN)/kubedevice demo

test: setup lint typecheck unit e2e

lint: setup
	$(BIN)/ruff check src tests bench examples scripts
	$(BIN)/ruff format --check src tests bench examples scripts
	$(BIN)/lint-imports

typecheck: setup
	$(BIN)/mypy

# pytest exits 5 when it collected no tests; that is a failure here too.
unit: setup
	$(BIN)/pytest -q -m "not e2e"

# The end-to-end tier on a real kube-apiserver, scheduler, controller-manager and kubelet
# (tests/e2e/README.md): in a private mount namespace when it can, see scripts/e2e.
e2e: setup
	PYTEST=$(BIN)/pytest scripts/e2e

proto: setup
	$(BIN)/python scripts/genproto.py

bench: setup
	@for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

fmt: setup
	$(BIN)/ruff format src tests bench examples scripts
	$(BIN)/ruff check --fix src tests bench examples scripts

clean:
	rm -rf $(VENV) build src/*.egg-info
