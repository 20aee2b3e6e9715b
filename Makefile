# The course's two commands: `make lab` and `make test`. Everything else: `make help`.
# Python line: the newest of python3.13 / python3.12, else python3 (3.11-3.13 are the tested lines);
# `make PYTHON=python3.11 test` selects the 3.11 line (jax 0.10.2). Each line has its own environment,
# synced exactly from uv.lock (packages the lock does not name are removed), the course's own package, spmd_course
# (src/spmd_course), installed editable: every notebook, test and script imports it from any folder, with no path set.
PYTHON ?= python3.13 python3.12 python3
# help and clean need no Python; every other target does, and is refused here without one.
NO_PYTHON_GOALS := help clean clean-xla
ifneq ($(filter-out $(NO_PYTHON_GOALS),$(or $(MAKECMDGOALS),help)),)
PY := $(shell tools/find-python $(PYTHON))
ifeq ($(PY),)
$(error no supported Python (3.11 to 3.13) among [$(PYTHON)]; pass PYTHON=/path/to/python3.12)
endif
PYVER := $(shell $(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
endif
VENV ?= $(if $(filter 3.11,$(PYVER)),.venv-py3.11,.venv)
BIN := $(VENV)/bin
# uv, pinned, bootstrapped with pip into .uv/ the first time: nothing but Python and make is needed.
UV_VERSION := 0.13.8
UV := .uv/bin/uv
SYNC = UV_PROJECT_ENVIRONMENT=$(1) $(UV) sync --locked --quiet --python $(2)
# Every notebook asks utils for 8 devices; this makes plain `import jax` agree, too.
export JAX_NUM_CPU_DEVICES ?= 8
export PYTHONHASHSEED := 0
# Python keeps each compiled module in __pycache__, so a later process reads it rather than compiling jax's
# 400-odd modules from source again: about 3 s of CPU in every notebook kernel, pytest worker and child process.
# Shells and container images that set PYTHONDONTWRITEBYTECODE lose that on every run. The environments and the
# (git-ignored) __pycache__ folders are the course's own, so make's commands write bytecode whatever the shell says.
unexport PYTHONDONTWRITEBYTECODE
# pytest-xdist: one worker per core (at most 4: each notebook kernel may take 1 GB), each test file whole on one
# worker (its module fixtures compile once). `make test JOBS=0` runs in one process; `JOBS=` anything xdist takes.
JOBS ?= auto --maxprocesses 4
XDIST = $(if $(filter 0,$(JOBS)),,-n $(JOBS) --dist loadfile)
# The 15 slowest tests at the end of every run, so what dominates stays visible.
DURATIONS := --durations=15

.PHONY: help env lab test test-slow published-rows plans test-units test-notebooks lint sync strip bench book clean requirements lock
help:
	@echo "make lab            JupyterLab on notebooks/ (builds the environment from uv.lock on first use)"
	@echo "make test           unit tests, ruff, and every notebook through pytest --nbmake (no torch download)"
	@echo "make test-slow      the slow checks: every notebook with a TPU host's device order and libtpu hidden,"
	@echo "                    the largest TPU compiles, a Colab-like runtime (needs PyPI), the compiler's memory"
	@echo "                    report, an executed miniature book"
	@echo "make PYTHON=python3.11 test   any target on the Python 3.11 line (jax 0.10.2)"
	@echo "make test-units     the fast tests in tests/ (make test without the notebooks)"
	@echo "make published-rows MaxText's published rows compiled again at full size and checked against data/published_rows (minutes a row; UPDATE=1 stores them)"
	@echo "make plans          the planner's rankings notebooks 25 and 26 read, compiled again at full size into data/plans (about 20 minutes of CPU; ONLY=name for one)"
	@echo "make test-notebooks every notebook through nbmake (make test without tests/)"
	@echo "make env            build or re-sync the environment (spmd_course, the course's package, installed editable);  make lint   ruff"
	@echo "make sync           pair notebooks with their .py sources, strip outputs, write src/spmd_course/models.py;  make strip"
	@echo "make book           the executed book (Sphinx + MyST-NB) in build/book/html"
	@echo "make bench          wall and CPU time and peak memory of each notebook against 15 s / 1 GB, median 8 s"
	@echo "make lock           re-resolve uv.lock after editing pyproject.toml (rewrites requirements.txt too)"
	@echo "make requirements   rewrite requirements.txt (pip's view of uv.lock) and binder/requirements.txt"
	@echo "make env-xla / test-xla / lab-xla / bench-xla / clean-xla"
	@echo "                    notebook 24 (PyTorch/XLA) in its own environment, .venv-xla (~4 GB)"
	@echo "make clean          remove the environments, caches and the built book (needs no Python, as help)"

$(UV):
	@echo ">> bootstrapping uv $(UV_VERSION) into .uv/ (once)"
	@$(PY) -m venv .uv && .uv/bin/python -m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

# Synced on every call: uv checks the lock in well under a second and installs only what changed.
env: $(UV)
	@echo ">> Python $(PYVER) at $(PY); environment $(VENV) synced from uv.lock"
	@$(call SYNC,$(VENV),$(PY))

lab: env
	@echo ">> starting JupyterLab on notebooks/ with $(VENV) (Ctrl-C to stop)"
	cd notebooks && ../$(BIN)/jupyter lab $(LAB_ARGS)
# Extra JupyterLab options, e.g. `make lab LAB_ARGS="--no-browser --port 8890"`; root (containers) needs --allow-root.
LAB_ARGS ?= $(if $(filter 0,$(shell id -u)),--allow-root)

test: env
	@echo ">> Python $(PYVER), $(VENV): unit tests (ruff included), then every notebook through nbmake"
	@$(BIN)/python -m pytest -m "not slow" $(XDIST) $(DURATIONS) $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo ">> pytest collected no tests: nothing was checked, which counts as a failure"; fi; \
	if [ $$rc -eq 0 ] && [ ! -x $(XLA_BIN)/python ]; then \
	  echo ">> notebook 24 (PyTorch/XLA) was not run: it needs its own 4 GB environment, 'make test-xla'"; fi; \
	exit $$rc

test-slow: env
	@echo ">> Python $(PYVER), $(VENV): the slow checks (make help says which)"
	$(BIN)/python -m pytest -m "slow and not published" $(XDIST) $(DURATIONS) $(PYTEST_ARGS)

# MaxText's published rows (utils.published_rows), each compiled at full size for its TPU slice: 75-200 s of
# CPU a row, so neither make test-slow nor CI compiles them: make test times the programs stored in
# data/published_rows. This target compiles every row again and checks each against its stored program;
# `make published-rows UPDATE=1` stores the new programs instead (one process: they share data/.../index.json).
published-rows: env
	PUBLISHED_ROWS_UPDATE=$(UPDATE) $(BIN)/python -m pytest -m published -s $(PYTEST_ARGS) tests/test_published_rows.py

# The planner's rankings that notebooks 25 and 26 show (utils.stored_plans): an 8B and a 70B model on v5e-256 and v5p-256,
# and every published MaxText row held against the planner, each a search with full-size TPU compiles at O0 (tens
# of seconds of CPU each). Written to data/plans/plans.json as each entry finishes; `make plans ONLY=8b-v5e` redoes
# one entry; make test-slow recomputes the cheapest stored entry and checks it.
plans: env
	$(BIN)/python tools/plans.py $(if $(ONLY),--only '$(ONLY)')

test-units: env
	$(BIN)/python -m pytest tests -m "not slow" $(XDIST) $(DURATIONS) $(PYTEST_ARGS)

test-notebooks: env
	$(BIN)/python -m pytest notebooks $(XDIST) $(DURATIONS) $(PYTEST_ARGS)

lint: env
	$(BIN)/ruff check .

# The .py sources are what you edit and review; this brings every .ipynb up to date (and the reverse
# for a notebook saved more recently in JupyterLab), then strips outputs.
sync: env
	$(BIN)/jupytext --sync notebooks/[0-9][0-9]_*.ipynb
	$(BIN)/nbstripout notebooks/[0-9][0-9]_*.ipynb
	$(BIN)/python tools/notebooks.py save
strip: env
	$(BIN)/nbstripout notebooks/[0-9][0-9]_*.ipynb

lock: $(UV)
	$(UV) lock
	@$(MAKE) --no-print-directory requirements

# requirements.txt: what `make lab` and `make test` install (the project, groups test, lab and tpu), exported
# from uv.lock with each line's markers, so plain `pip install -r requirements.txt` gets either Python line.
# tests/test_tooling.py runs this same command and compares. Its `-e .` line installs the course's package (editable,
# so pip runs from the clone's root). tools/binder.py, which imports that package, then pins Binder's packages from it.
REQUIREMENTS_EXPORT := export --frozen --offline --no-hashes --format requirements-txt --no-default-groups \
	--group test --group lab --group tpu -o requirements.txt
# The lock covers Linux and macOS, so pip on Windows skips every line without a word: the file's first line says so.
REQUIREMENTS_NOTE := Linux and macOS only: on Windows pip skips every line below, so use WSL, Colab or Binder.
requirements: env
	$(UV) --quiet $(REQUIREMENTS_EXPORT)
	@{ echo "# $(REQUIREMENTS_NOTE)"; cat requirements.txt; } > requirements.txt.new && mv requirements.txt.new requirements.txt
	$(BIN)/python tools/binder.py

bench: env
	@echo ">> running every notebook once: wall and CPU time and peak memory against 15 s / 1 GB, median 8 s"
	$(BIN)/python tools/bench.py

# One page at a time: with -j, MyST-NB's processes race to create the execution cache's database.
# The book: every notebook executed into a Sphinx book (MyST-NB, sphinx-book-theme) in build/book/html; it
# reads offline. MyST-NB's cache re-runs only notebooks whose code changed. Where .venv-xla exists, notebook 24
# is executed there first, into the same cache; otherwise its page shows its code without outputs.
book: env
	@if [ -x $(XLA_BIN)/python ]; then \
	  echo ">> notebook 24 (PyTorch/XLA): executed in $(XLA_VENV) into the book's cache"; \
	  $(XLA_RUN) $(XLA_BIN)/python docs/execute_cached.py || exit 1; \
	else \
	  echo ">> no $(XLA_VENV): notebook 24 goes into the book without outputs ('make env-xla' creates it)"; \
	fi
	$(BIN)/sphinx-build -W --keep-going -b html -d build/book/doctrees docs build/book/html
	@$(BIN)/python docs/execute_cached.py --check $(if $(wildcard $(XLA_BIN)/python),,--skip-xla)
	@echo ">> the book is in build/book/html: open build/book/html/index.html"

clean:
	rm -rf .venv .venv-py3.11 .uv .pytest_cache .ruff_cache build
	find . -name __pycache__ -o -name .ipynb_checkpoints | grep -v '^./.venv' | xargs rm -rf

# PyTorch/XLA side by side: notebook 24 runs torch 2.9.0 + torch-xla 2.9.0 next to jax 0.10.2, in its own
# environment .venv-xla on Python 3.11 (the lock's xla group). On x86_64 PyPI serves torch's CUDA build:
# about 4 GB to download and 8 GB on disk, although no GPU is needed. `make test` never needs it.
XLA_PYTHON ?= python3.11
XLA_VENV := .venv-xla
XLA_BIN := $(XLA_VENV)/bin
# torch_xla takes its device count from these when its runtime starts (it ignores XLA_FLAGS' device
# count); TF_CPP_MIN_LOG_LEVEL=2 silences the GSPMD deprecation warning it prints at every compile.
XLA_RUN := PJRT_DEVICE=CPU CPU_NUM_DEVICES=8 TF_CPP_MIN_LOG_LEVEL=2

.PHONY: env-xla test-xla lab-xla bench-xla clean-xla
env-xla: $(UV)
	@xpy=$$(tools/find-python $(XLA_PYTHON)) || exit 1; \
	echo ">> PyTorch/XLA environment $(XLA_VENV) with Python at $$xpy (first run: ~4 GB, minutes)"; \
	$(call SYNC,$(XLA_VENV),$$xpy) --group xla

test-xla: env-xla
	@echo ">> $(XLA_VENV): notebook 24 (PyTorch/XLA next to JAX, 8 CPU devices each), its exercises, use_spmd's order"
	$(XLA_RUN) $(XLA_BIN)/python -m pytest notebooks/24_pytorch_xla.ipynb tests/test_ex24_pytorch_xla.py \
	  tests/test_24_pytorch_xla_use_spmd.py tests/test_exercises.py -k "24_pytorch_xla or test_ex24"

bench-xla: env-xla
	$(XLA_RUN) $(XLA_BIN)/python tools/bench.py notebooks/24_pytorch_xla.ipynb

lab-xla: env-xla
	@echo ">> starting JupyterLab on notebooks/ with $(XLA_VENV): open 24_pytorch_xla.ipynb (Ctrl-C to stop)"
	cd notebooks && $(XLA_RUN) ../$(XLA_BIN)/jupyter lab $(LAB_ARGS)

clean-xla:
	rm -rf $(XLA_VENV)
