# Quick start: `make demo` then `make test`. Both create/reuse .venv and install torch (CPU) before the project.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_PIN := torch==2.13.0
# the extras the test suite exercises (each optional backend's tests skip, saying so, when it is missing)
EXTRAS := test,cluster,report,privacy,cost,scan,bom,postgres
# pytest-xdist workers of `make test` (0: one process, in file order). 2 by default (--dist loadgroup as
# tests/conftest.py refines it: a module's tests stay on one worker, the Ray clusters' tests run on one worker one
# after another): one process took 701 s in CI on the 2-core reference machine, over the 10-minute budget; servers
# that tests start take ports from modelward.core.ports (outside the kernel's ephemeral range), so two workers do
# not race for them.
PYTEST_WORKERS ?= 2
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
	rm -rf $(VENV) .venv-vision .venv-kserve demo-out .pytest_cache .ruff_cache

# guard-state: Debian's PostgreSQL server for the guard store tests (tests start their own throwaway cluster)
.PHONY: postgres
postgres:
	bash .ci/postgres.sh

# ---- issue 39 (byom): models from torchvision and timm, in their own venv ---------------------------------------
# PyPI's torchvision wheel is linked against the CUDA build of torch: beside the CPU torch its C++ operators cannot
# load, and `import torchvision` stops at "operator torchvision::nms does not exist". modelward imports it anyway
# for the classification models (modelward.core.sources.import_torchvision defines the two operator schemas
# torchvision's meta registrations need, only in that case). It lives in its own venv so that nothing in the main
# one ever meets a torchvision that fails to import; torchattacks (without its deps) is the reference of the vision
# example's agreement test. `make test` makes it (about 2 min, 1.8 GB) so CI runs the vision tests; the main suite
# re-runs them there (tests/e2e/test_assess_vision_example.py) and `make test-vision` runs them directly.
VISION_VENV := .venv-vision
VISION_PY := $(VISION_VENV)/bin/python
VISION_STAMP := $(VISION_VENV)/.installed-$(shell cat pyproject.toml Makefile | cksum | cut -d' ' -f1)
EXTRAS := $(EXTRAS),text

$(VISION_STAMP): pyproject.toml Makefile
	test -x $(VISION_PY) || $(PYTHON) -m venv $(VISION_VENV)
	$(VISION_PY) -m pip install -q "$(TORCH_PIN)"
	$(VISION_PY) -m pip install -q -e ".[test,scan,vision]"
	$(VISION_PY) -m pip install -q --no-deps "torchattacks>=3.5"
	rm -f $(VISION_VENV)/.installed-*
	touch $(VISION_STAMP)

.PHONY: vision test-vision
vision: $(VISION_STAMP)

test: vision

test-vision: vision
	$(VISION_PY) -m pytest -q -p no:cacheprovider tests/core/test_sources_vision.py tests/e2e/test_assess_vision_example.py

# ---- issue 40 (guard-front): KServe in its own environment, so its pins never touch the project's (the proxy-mode
# tests stand in front of a real KServe ModelServer started from it; bench/guard_service.py measures it beside the
# guard). `make test` makes it so CI runs the KServe case; without it those tests use a second `guard serve`.
KSERVE_VENV := .venv-kserve
KSERVE_STAMP := $(KSERVE_VENV)/.installed-kserve-0.21.0
$(KSERVE_STAMP):
	test -x $(KSERVE_VENV)/bin/python || $(PYTHON) -m venv $(KSERVE_VENV)
	$(KSERVE_VENV)/bin/python -m pip install -q "$(TORCH_PIN)"
	$(KSERVE_VENV)/bin/python -m pip install -q "kserve==0.21.0" safetensors
	touch $(KSERVE_STAMP)

.PHONY: kserve-env
kserve-env: $(KSERVE_STAMP)

test: kserve-env
