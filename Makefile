# Quick start: `make demo` then `make test`. Both create/reuse .venv and install torch (CPU) before the project.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_PIN := torch==2.13.0
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | cksum | cut -d' ' -f1)

.PHONY: install demo test lint bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(STAMP): $(PY) pyproject.toml Makefile
	$(PIP) install -q "$(TORCH_PIN)"
	$(PIP) install -q -e ".[test,cost]"
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/modelward demo --out demo-out

test: install
	$(VENV)/bin/ruff check src tests bench
	$(PY) -m pytest -q -p no:cacheprovider

lint: install
	$(VENV)/bin/ruff check src tests bench

# Benchmark-only baselines. torchattacks declares torchvision, which would replace the CPU torch with a CUDA
# build, so the baselines are installed without their dependencies (they do not need torchvision to run).
bench: install
	$(PIP) install -q "$(TORCH_PIN)" tqdm requests
	$(PIP) install -q --no-deps "torchattacks>=3.5" "adversarial-robustness-toolbox>=1.17"
	@for f in bench/*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

clean:
	rm -rf $(VENV) demo-out .pytest_cache .ruff_cache
