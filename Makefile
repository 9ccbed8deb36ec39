# Quick start: `make demo` then `make test`. Both create/reuse .venv and install torch (CPU) before the project.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_PIN := torch==2.13.0
# the extras the test suite exercises (each optional backend's tests skip, saying so, when it is missing)
EXTRAS := test,cluster,report,privacy,cost,scan,bom
# pytest-xdist workers of `make test` (0: one process, in file order). Two workers (--dist loadgroup as
# tests/conftest.py refines it: a module's tests stay on one worker, the Ray clusters' tests run on one worker one
# after another) take about 8.5 min on the 2-core reference machine instead of about 16. The two causes that once made
# results depend on which tests shared a worker are fixed: a module fixture drew its model from the global RNG the
# previous test left (the RNGs are now seeded before each module's fixtures), and torch.set_num_threads from a side
# thread split the rounding between the driver's and the parties' threads (modelward.core.threads).
PYTEST_WORKERS ?= 2
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | cksum | cut -d' ' -f1)

.PHONY: install browser demo test lint bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(STAMP): $(PY) pyproject.toml Makefile
	$(PIP) install -q "$(TORCH_PIN)"
	$(PIP) install -q -e ".[$(EXTRAS)]"
	# torchattacks is the reference of the AutoAttack agreement test; it declares torchvision, which would replace
	# the CPU torch, so it is installed without its dependencies (it does not need torchvision to run)
	$(PIP) install -q --no-deps "torchattacks>=3.5"
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/modelward demo --out demo-out

# the report's browser test renders in Debian's chromium; where apt-get cannot install it, that test skips
browser:
	@command -v chromium >/dev/null 2>&1 || (apt-get install -y -q chromium >/dev/null 2>&1 || \
	  (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1)) || \
	  echo "note: chromium could not be installed; the report browser test will skip"

test: install browser
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest -q -p no:cacheprovider -n $(PYTEST_WORKERS) --dist loadgroup

lint: install
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/lint-imports --no-cache

# Benchmark-only baselines. torchattacks declares torchvision, which would replace the CPU torch with a CUDA
# build, so the baselines are installed without their dependencies (they do not need torchvision to run).
bench: install
	$(PIP) install -q "$(TORCH_PIN)" tqdm requests
	$(PIP) install -q --no-deps "torchattacks>=3.5" "adversarial-robustness-toolbox>=1.17"
	@for f in bench/*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

clean:
	rm -rf $(VENV) demo-out .pytest_cache .ruff_cache
