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
export MPLBACKEND ?= Agg

.PHONY: env lab test test-units test-notebooks lint bench strip clean help html
help:
	@echo "make lab    start JupyterLab on notebooks/ (creates $(VENV) on first use)"
	@echo "make test   unit tests + every notebook through pytest --nbmake + ruff"
	@echo "make bench  wall time and peak memory of each notebook against the budgets"
	@echo "make PYTHON=python3.11 test   the same on the Python 3.11 line"

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

test-units: $(STAMP)
	$(BIN)/python -m pytest tests

test-notebooks: $(STAMP)
	$(BIN)/python -m pytest notebooks

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	@echo ">> running every notebook once: wall time and peak memory against 30 s / 1 GB"
	$(BIN)/python tools/bench.py notebooks

strip: $(STAMP)
	$(BIN)/python tools/notebooks.py strip

clean:
	rm -rf .venv .venv-py3.11 .pytest_cache site

html: $(STAMP)
	@echo ">> executing every notebook and writing the HTML edition to site/ (open site/index.html)"
	$(BIN)/python tools/build_html.py --out site
