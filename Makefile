# The two commands of the README: `make demo` (set up, run the main job) and `make test` (set up, run the tests).
# `make demo` keeps the previous demo run as runs/demo.prev.
# The virtualenv lives at .venv/ and is reused; it is rebuilt only when setup.cfg or pyproject.toml change.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: venv demo numerics-demo test test-slow bench clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,dmc,brax,distributed]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	if [ -d runs/demo ]; then rm -rf runs/demo.prev && mv runs/demo runs/demo.prev; fi
	MUJOCO_GL=egl $(PY) -m experiments.sac --config=demo.py --run_dir=runs/demo

numerics-demo: $(STAMP)
	$(PY) -m experiments.numerics_demo

test: $(STAMP)
	$(PY) -m pytest -n 2 --dist loadgroup -m "not slow" $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(PY) -m pytest -n 2 --dist loadgroup -m slow $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) -m benchmarks.optimizer_overhead

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .hypothesis runs
