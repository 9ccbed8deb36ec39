# Quick start: `make demo` then `make test`. Both create/reuse .venv and install torch (CPU) before the project.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_PIN := torch==2.13.0
# the extras the test suite exercises (each optional backend's tests skip, saying so, when it is missing)
EXTRAS := test,cluster,report,privacy,cost,scan,bom
# pytest-xdist workers of `make test` (0: one process, in file order). With 2 (--dist loadgroup as tests/conftest.py
# refines it: a module's tests stay on one worker, the Ray clusters' tests run on one worker one after another) the
# suite takes about half the time of one process on the 2-core reference machine; see README for the figures.
PYTEST_WORKERS ?= 0
# The second kernel path of `make test`: the numeric tests (tests/numeric_tests.txt: tolerances, bit-exactness that
# the design promises, learned-outcome bounds) run again with ATen's scalar kernels, MKL's compatible code path and
# oneDNN off (tests/conftest.py reads MODELWARD_TEST_ONEDNN), so that a result which holds only on this CPU's kernels
# (AVX-512, AVX2, AMX round differently) fails in CI rather than on a user's machine
NUMERIC_KERNELS := ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE MODELWARD_TEST_ONEDNN=0
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | cksum | cut -d' ' -f1)

.PHONY: install browser demo test test-kernels lint bench clean

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
	$(MAKE) --no-print-directory test-kernels

# the numeric tests through the second kernel path alone (part of `make test`; one process: they take seconds)
test-kernels: install
	$(NUMERIC_KERNELS) $(PY) -m pytest -q -p no:cacheprovider @tests/numeric_tests.txt

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
