# The course's two commands: `make lab` and `make test`. Also: `make bench`, `make lint`, `make strip`.
# Python line: the newest of python3.13 / python3.12, else python3.  `make PYTHON=python3.11 test`
# selects the 3.11 line (jax 0.10.2); each line keeps its own virtual environment.
PYTHON ?= python3.13 python3.12 python3
PY := $(shell tools/find-python $(PYTHON))
ifeq ($(PY),)
$(error no working Python found among [$(PYTHON)]; pass PYTHON=/path/to/python)
endif
PYVER := $(shell $(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
VENV ?= $(if $(filter 3.11,$(PYVER)),.venv-py3.11,.venv)
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(PYVER)
# Every notebook asks utils for 8 devices; this makes plain `import jax` agree, too.
export JAX_NUM_CPU_DEVICES ?= 8
export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))
export PYTHONHASHSEED := 0
# `make test` also runs `make test-xla` (below) on the default line, not on the 3.11 line, so that
# .ci/run, which tests both lines, runs notebook 14 once. `make test WITH_XLA=` skips it.
WITH_XLA ?= $(if $(filter 3.11,$(PYVER)),,1)

.PHONY: env lab test test-units test-notebooks lint bench strip clean help html
help:
	@echo "make lab    start JupyterLab on notebooks/ (creates $(VENV) on first use)"
	@echo "make test   unit tests + every notebook through pytest --nbmake + ruff"
	@echo "make bench  wall time and peak memory of each notebook against the budgets"
	@echo "make PYTHON=python3.11 test   the same on the Python 3.11 line"
	@echo "make test-xla / lab-xla   notebook 14 (PyTorch/XLA) in its own environment $(XLA_VENV)"

env: $(STAMP)
$(STAMP): requirements.txt requirements-test.txt
	@echo ">> Python $(PYVER) at $(PY); environment $(VENV)"
	@test -x $(BIN)/python || { echo ">> creating $(VENV)"; $(PY) -m venv $(VENV); }
	@echo ">> installing the pinned requirements into $(VENV) (first run: a few minutes)"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements-test.txt
	@rm -f $(VENV)/.installed-*; touch $@
	@echo ">> $(VENV) ready"

# Extra JupyterLab options, e.g. `make lab LAB_ARGS="--no-browser --port 8890"`; root (containers) needs --allow-root.
LAB_ARGS ?= $(if $(filter 0,$(shell id -u)),--allow-root)
lab: $(STAMP)
	@echo ">> starting JupyterLab on notebooks/ with $(VENV) (Ctrl-C to stop)"
	cd notebooks && ../$(BIN)/jupyter lab $(LAB_ARGS)

test: $(STAMP)
	@echo ">> Python $(PYVER), $(VENV): unit tests (ruff included), then every notebook through nbmake"
	@$(BIN)/python -m pytest; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo ">> pytest collected no tests: nothing was checked, which counts as a failure"; fi; \
	exit $$rc
ifneq ($(WITH_XLA),)
	@echo ">> then notebook 14 (PyTorch/XLA) in its own environment $(XLA_VENV): make test-xla"
	@$(MAKE) --no-print-directory test-xla
endif

test-units: $(STAMP)
	$(BIN)/python -m pytest tests

test-notebooks: $(STAMP)
	$(BIN)/python -m pytest notebooks

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	@echo ">> running every notebook once: wall time and peak memory against 30 s / 1 GB"
	$(BIN)/python tools/bench.py
ifneq ($(WITH_XLA),)
	@$(MAKE) --no-print-directory bench-xla
endif

strip: $(STAMP)
	$(BIN)/python tools/notebooks.py strip

clean:
	rm -rf .venv .venv-py3.11 .pytest_cache site

html: $(STAMP)
	@echo ">> executing every notebook and writing the HTML edition to site/ (open site/index.html)"
	$(BIN)/python tools/build_html.py --out site
	@$(MAKE) --no-print-directory html-xla

# PyTorch/XLA side by side: notebook 14 runs torch 2.9.0 + torch-xla 2.9.0 next to jax 0.10.2, in its own
# environment $(XLA_VENV) on Python 3.11 (requirements-xla.txt). On x86_64 PyPI serves torch's CUDA build:
# about 4 GB to download and 8 GB on disk (5.5 min here), although no GPU is needed. The main environments
# never collect notebook 14 (notebooks/conftest.py); here it runs with its exercises.
#   make test-xla   notebook 14 through nbmake, and the checkers of its exercises
#   make lab-xla    JupyterLab on notebooks/ with that environment's kernel
XLA_PYTHON ?= python3.11
XLA_VENV := .venv-xla
XLA_BIN := $(XLA_VENV)/bin
XLA_STAMP := $(XLA_VENV)/.installed
# torch_xla takes its device count from these when its runtime starts (it ignores XLA_FLAGS' device
# count); TF_CPP_MIN_LOG_LEVEL=2 silences the GSPMD deprecation warning it prints at every compile.
XLA_RUN := PJRT_DEVICE=CPU CPU_NUM_DEVICES=8 TF_CPP_MIN_LOG_LEVEL=2

.PHONY: env-xla test-xla lab-xla clean-xla bench-xla html-xla
env-xla: $(XLA_STAMP)
$(XLA_STAMP): requirements-xla.txt requirements-test.txt requirements.txt
	@xpy=$$(tools/find-python $(XLA_PYTHON)) || exit 1; \
	echo ">> PyTorch/XLA environment $(XLA_VENV) with Python at $$xpy"; \
	test -x $(XLA_BIN)/python || { echo ">> creating $(XLA_VENV)"; $$xpy -m venv $(XLA_VENV); }
	@echo ">> installing requirements-xla.txt into $(XLA_VENV): torch, torch-xla, jax 0.10.2 (first run: ~4 GB, minutes)"
	$(XLA_BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(XLA_BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements-xla.txt
	@touch $@
	@echo ">> $(XLA_VENV) ready ($$(du -sh $(XLA_VENV) | cut -f1) on disk)"

test-xla: $(XLA_STAMP)
	@echo ">> $(XLA_VENV): notebook 14 (PyTorch/XLA next to JAX, 8 CPU devices each) and its exercises"
	$(XLA_RUN) $(XLA_BIN)/python -m pytest notebooks/14_pytorch_xla.ipynb tests/test_exercises.py -k 14_pytorch_xla

bench-xla: $(XLA_STAMP)
	@echo ">> $(XLA_VENV): time and peak memory of notebook 14"
	$(XLA_RUN) $(XLA_BIN)/python tools/bench.py notebooks/14_pytorch_xla.ipynb

html-xla: $(XLA_STAMP)
	@echo ">> $(XLA_VENV): the HTML page of notebook 14 (the index already lists it)"
	$(XLA_RUN) $(XLA_BIN)/python tools/build_html.py --out site notebooks/14_pytorch_xla.ipynb

lab-xla: $(XLA_STAMP)
	@echo ">> starting JupyterLab on notebooks/ with $(XLA_VENV): open 14_pytorch_xla.ipynb (Ctrl-C to stop)"
	cd notebooks && $(XLA_RUN) ../$(XLA_BIN)/jupyter lab $(LAB_ARGS)

clean-xla:
	rm -rf $(XLA_VENV)
