# The two commands of the README: `make demo` (set up, run the main job) and `make test` (set up, run the tests).
#
# Supported: Python 3.11-3.13 with jax 0.10.2 up to the newest 0.12.x. Three virtualenvs, each rebuilt only when
# setup.cfg, pyproject.toml or its constraints change:
#   .venv         Python 3.12 with the newest jax and every extra: `make test` (the full tier), `make demo`.
#                 3.12 is the newest Python whose wheels cover the whole stack (dm_control's labmaze has none for
#                 3.13, and building it needs bazel).
#   .venv-newest  the newest Python found (3.13 or later) with the newest jax, the library's core install (no
#                 extra but dev: no matplotlib, no tensorboardX): `make test-newest`
#   .venv-oldest  Python 3.11 with jax 0.10.2 (constraints/oldest.txt), the int8 runtime and torch: `make test-oldest`
# The two short tiers run the library's core: numerics, precision, optimizers, kernels (interpret mode) and one
# SAC update. Interpreters are found on PATH or in pyenv; override them with PYTHON=..., PYTHON_NEWEST=...,
# PYTHON_OLDEST=...; `make python` prints the ones found.

# The first interpreter of the given versions that runs (pyenv shims of uninstalled versions do not).
find_python = $(firstword $(foreach v,$(1),$(shell for p in $$(command -v python$(v) 2>/dev/null) \
    $$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/$(v).*/bin/python$(v) 2>/dev/null | sort -V -r); do \
    "$$p" -c pass >/dev/null 2>&1 && echo "$$p" && break; done)))

PYTHON        ?= $(call find_python,3.12)
PYTHON_NEWEST ?= $(call find_python,3.14 3.13)
PYTHON_OLDEST ?= $(call find_python,3.11)
VENV          := .venv
VENV_NEWEST   := .venv-newest
VENV_OLDEST   := .venv-oldest
PY            := $(VENV)/bin/python
PY_NEWEST     := $(VENV_NEWEST)/bin/python
PY_OLDEST     := $(VENV_OLDEST)/bin/python
STAMP         := $(VENV)/.installed
STAMP_NEWEST  := $(VENV_NEWEST)/.installed
STAMP_OLDEST  := $(VENV_OLDEST)/.installed
PYTEST_ARGS   ?=
PY_GPU        ?= python3
# The short tiers: the numerics, precision policies, optimizers, kernels (interpret mode), one SAC update, and the
# package (every module imports without the extras; the wheel). They need no extra: no matplotlib, no tensorboardX.
# The oldest one also runs the int8 actor runtime, and compares the loss scaler with torch's GradScaler and the
# int8 runtime with torch's quantize_dynamic (torch has a CPU wheel here only for Python 3.11).
CORE_TESTS    := tests/optim tests/test_numerics.py tests/test_precision.py tests/kernels tests/test_package.py \
                 tests/test_sharding.py tests/test_replay.py \
                 tests/agents/test_sac.py::test_fp16_with_methods_stays_finite_where_naive_fp16_does_not
OLDEST_TESTS  := $(CORE_TESTS) tests/inference

.PHONY: python venv venv-newest venv-oldest lint demo numerics-demo test test-newest test-oldest test-notebooks notebooks \
        test-slow test-gpu bench bench-gpu bench-gpu-train gpu-wheels gpu-lpjax clean

python:
	@echo "full tier: $(PYTHON)"; echo "newest:    $(PYTHON_NEWEST)"; echo "oldest:    $(PYTHON_OLDEST)"

$(STAMP): setup.cfg pyproject.toml
	@test -n "$(PYTHON)" || { echo "no Python 3.12 found (PATH or pyenv); set PYTHON=..." >&2; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,runs,dmc,brax,mjx,distributed]'
	@# gymnax (the PPO port's environments) pins jax<0.12 but runs on the newest jax: its other requirements are
	@# installed with theirs, gymnax itself without its pins.
	$(PY) -m pip install --quiet 'gymnasium>=1.1,<1.4' seaborn
	$(PY) -m pip install --quiet --no-deps gymnax
	touch $(STAMP)

$(STAMP_NEWEST): setup.cfg pyproject.toml
	@test -n "$(PYTHON_NEWEST)" || { echo "no Python >= 3.13 found (PATH or pyenv); set PYTHON_NEWEST=..." >&2; exit 1; }
	test -x $(PY_NEWEST) || $(PYTHON_NEWEST) -m venv $(VENV_NEWEST)
	$(PY_NEWEST) -m pip install --quiet --upgrade pip jax
	@# A project that already holds the newest jax keeps it when it installs lpjax (no upper pin, no downgrade).
	before=$$($(PY_NEWEST) -c 'import jax; print(jax.__version__)') && \
	$(PY_NEWEST) -m pip install --quiet -e '.[dev]' && \
	after=$$($(PY_NEWEST) -c 'import jax; print(jax.__version__)') && \
	{ test "$$before" = "$$after" || { echo "installing lpjax changed jax $$before -> $$after" >&2; exit 1; }; }
	touch $(STAMP_NEWEST)

$(STAMP_OLDEST): setup.cfg pyproject.toml constraints/oldest.txt
	@test -n "$(PYTHON_OLDEST)" || { echo "no Python 3.11 found (PATH or pyenv); set PYTHON_OLDEST=..." >&2; exit 1; }
	test -x $(PY_OLDEST) || $(PYTHON_OLDEST) -m venv $(VENV_OLDEST)
	$(PY_OLDEST) -m pip install --quiet --upgrade pip
	$(PY_OLDEST) -m pip install --quiet -c constraints/oldest.txt -e '.[dev,int8]' 'torch==2.13.0'
	touch $(STAMP_OLDEST)

venv: $(STAMP)

venv-newest: $(STAMP_NEWEST)

venv-oldest: $(STAMP_OLDEST)

demo: $(STAMP)
	if [ -d runs/demo ]; then rm -rf runs/demo.prev && mv runs/demo runs/demo.prev; fi
	MUJOCO_GL=egl $(PY) -m experiments.demo --run_dir=runs/demo

numerics-demo: $(STAMP)
	$(PY) -m experiments.numerics_demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: lint
	$(PY) -m pytest -n 2 --dist loadgroup -m "not slow and not torch and not notebooks and not gpu" --durations=25 $(PYTEST_ARGS)

test-newest: $(STAMP_NEWEST)
	$(PY_NEWEST) -m pytest -n 2 --dist loadgroup -m "not slow and not torch and not gpu" $(CORE_TESTS) $(PYTEST_ARGS)

test-oldest: $(STAMP_OLDEST)
	$(PY_OLDEST) -m pytest -n 2 --dist loadgroup -m "not slow and not gpu" $(OLDEST_TESTS) $(PYTEST_ARGS)

# Every notebook installs lpjax into one fresh virtualenv with its own first cell: one at a time, no -n.
test-notebooks: $(STAMP)
	$(PY) -m pytest -m notebooks tests/test_notebooks.py $(PYTEST_ARGS)

# Re-runs the notebooks at full size and saves them with their outputs (needed after any code-cell edit).
notebooks: $(STAMP)
	$(PY) colab/execute.py

# On a GPU machine (PY_GPU's jax has the CUDA plugin): every kernel test compiled on the GPU instead of interpreted,
# and the full-size ones (marker gpu), run like bench-gpu below from $(GPU_SITE), where gpu-lpjax installs lpjax
# with its kernels; 8 workers that allocate GPU memory as they go (about 2 minutes on an H100).
test-gpu: gpu-lpjax
	cd $(GPU_SITE) && XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=$(GPU_SITE):$(CURDIR) $(PY_GPU) -m pytest \
	    -p no:cacheprovider -n 8 -m "not slow" $(CURDIR)/tests/kernels $(PYTEST_ARGS)

# The GPU suite and the fp32-vs-fp16 training race, on the GPU machine (its python3 has jax with CUDA, flax, optax,
# orbax and chex, and no network): run `make gpu-wheels` here first and carry gpu-wheels/ there. Both install the
# carried wheels into $(GPU_SITE) once (the one-line install: python3 -m pip install -q --no-index --no-deps
# --no-compile --no-cache-dir --target /tmp/site gpu-wheels/*.whl && export PYTHONPATH=/tmp/site), copy lpjax with
# its kernels there (what `pip install .` installs), and run from $(GPU_SITE) with PYTHONPATH=$(GPU_SITE):<checkout>
# (no .venv needed; from the checkout `python -m` would import its lpjax/, which lacks lpjax.kernels). Paths in
# BENCH_ARGS must be absolute. Without the wheels the suite still runs; the parts that need them (table10 reads the
# experiment configs through ml_collections, jitted_loop needs MJX) record the missing import.
GPU_WHEELS      := gpu-wheels
GPU_SITE        ?= /tmp/site
GPU_WHEEL_FILES := $(wildcard $(GPU_WHEELS)/*.whl)
BENCH_ARGS      ?=

gpu-wheels:
	@test -n "$(PYTHON)" || { echo "no Python 3.12 found (PATH or pyenv); set PYTHON=..." >&2; exit 1; }
	rm -rf $(GPU_WHEELS) && mkdir -p $(GPU_WHEELS)
	$(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	    --dest $(GPU_WHEELS) -r constraints/gpu-wheels.txt
	du -sh $(GPU_WHEELS)

$(GPU_SITE)/.wheels-installed: $(GPU_WHEEL_FILES)
	mkdir -p $(GPU_SITE)
	$(if $(GPU_WHEEL_FILES),$(PY_GPU) -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
	    --target $(GPU_SITE) $(GPU_WHEEL_FILES),@echo "no wheels in $(GPU_WHEELS)/: the MJX parts will record that")
	touch $@

gpu-lpjax: $(GPU_SITE)/.wheels-installed
	rm -rf $(GPU_SITE)/lpjax && cp -r lpjax $(GPU_SITE)/lpjax && cp -r kernels $(GPU_SITE)/lpjax/kernels

bench-gpu: gpu-lpjax
	cd $(GPU_SITE) && PYTHONPATH=$(GPU_SITE):$(CURDIR) $(PY_GPU) -m benchmarks.gpu_suite $(BENCH_ARGS)

bench-gpu-train: gpu-lpjax
	cd $(GPU_SITE) && PYTHONPATH=$(GPU_SITE):$(CURDIR) $(PY_GPU) -m benchmarks.gpu_train $(BENCH_ARGS)

test-slow: $(STAMP)
	$(PY) -m pytest -n 2 --dist loadgroup -m slow $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) -m benchmarks.optimizer_overhead

clean:
	rm -rf $(VENV) $(VENV_NEWEST) $(VENV_OLDEST) *.egg-info .pytest_cache .hypothesis runs
