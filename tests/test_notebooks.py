"""The notebooks in colab/, and the numerics demo (experiments/numerics_demo.py) reduced.

Default tier (nothing is executed in a kernel):

* each notebook's first code cell is the install cell: ``LPJAX_SOURCE`` at its top, overridable by the environment
  variable, and the extras of :data:`EXTRAS`; the cell is the same code in every notebook, extras aside;
* the install cell's logic, run as a plain script with pip and git faked: which checkout lpjax is installed from (a
  git URL cloned into ./lpjax, an explicit checkout, the checkout the notebook is in, ./lpjax, or a one-line stop;
  not a wheel: the notebooks use the checkout's ``experiments/``, which is not installed), that the checkout goes on
  ``sys.path`` after site-packages, and which jax plugin an accelerator gets;
* the committed outputs (the notebooks are committed executed, by ``colab/execute.py``): no errors, a figure for each
  cell that makes one, executed top to bottom from the current sources (``metadata.lpjax.code_sha256``) at the
  normal size, no local paths, under 1 MB;
* every call a notebook makes into lpjax, experiments or benchmarks by an imported name binds to the signature it
  calls (a static check of the sources).

``notebooks`` marker (``make test-notebooks``): a fresh virtualenv (``python -m venv`` plus ipykernel and nbclient,
what a Colab runtime brings) is built once per session; every notebook runs in it, reduced, from a directory outside
the checkout, and its install cell installs lpjax from ``LPJAX_SOURCE`` = a copy of this checkout (lpjax and
``lpjax.kernels`` then come from site-packages, ``experiments`` from the copy). The notebooks
share the virtualenv, so the extras one installs are there for the next (the default tier checks each notebook's
extras against :data:`EXTRAS`). It needs the package index and takes about 8 minutes on 2 CPU cores. Run it
serially (no ``-n``): each notebook installs into the one virtualenv.
"""

from __future__ import annotations

import ast
import configparser
import importlib
import importlib.util
import inspect
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import nbformat
import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
COLAB = REPO_ROOT / "colab"
NOTEBOOKS = sorted(COLAB.glob("*.ipynb"))
IDS = [p.name for p in NOTEBOOKS]
NOTEBOOK_STEPS = 200  # LPJAX_NOTEBOOK_STEPS of the reduced runs
MAX_NOTEBOOK_BYTES = 1_000_000

# The extras of setup.cfg each notebook installs (LPJAX_EXTRAS in its first cell): `runs` for matplotlib (every
# notebook plots) and the run logs of the training loops, `dmc` for the DeepMind Control tasks, `int8` for ActorQ's
# int8 actors (ONNX Runtime; the notebook runs its actors in-process, without Ray), `examples` for the worked ports'
# data (scikit-learn's digits).
EXTRAS = {
    "01_numerics.ipynb": "runs",
    "02_sac_fp16.ipynb": "runs,dmc",
    "03_kernels.ipynb": "runs",
    "04_actorq.ipynb": "runs,dmc,int8",
    "05_fp8_grpo.ipynb": "runs",
    "06_precision_inspector.ipynb": "runs",
    "07_your_own_code.ipynb": "runs,examples",
}

# Output text that names a place on the machine that ran the notebook.
LOCAL_PATH = re.compile(r"/(home|root|Users|tmp|work|private)/|site-packages|dist-packages|[A-Z]:\\\\")


def _load_execute_script():
    spec = importlib.util.spec_from_file_location("colab_execute", COLAB / "execute.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


execute_script = _load_execute_script()


def _code_cells(nb):
    return [cell for cell in nb.cells if cell.cell_type == "code"]


def _install_cell(path: Path) -> str:
    return _code_cells(nbformat.read(path, as_version=4))[0].source


def _extras(source: str) -> str:
    match = re.search(r'^LPJAX_EXTRAS = "([^"]*)"', source, flags=re.M)
    assert match, 'no LPJAX_EXTRAS = "..." line'
    return match.group(1)


def _setup_cfg_extras() -> set[str]:
    config = configparser.ConfigParser()
    config.read(REPO_ROOT / "setup.cfg")
    return set(config["options.extras_require"])


def _text_outputs(cell) -> list[str]:
    texts = []
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream":
            texts.append(output.get("text", ""))
        elif output.get("output_type") == "error":
            texts.append("\n".join(output.get("traceback", [])))
        else:
            data = output.get("data", {})
            texts.extend(str(data[key]) for key in data if key.startswith("text/"))
    return texts


def _makes_a_figure(cell) -> bool:
    return bool(re.search(r"\bplt\.(subplots|figure)\(", cell.source))


# --- the install cell -------------------------------------------------------------------------------------------


def test_notebooks_found():
    assert NOTEBOOKS, "no notebook in colab/"
    assert set(IDS) == set(EXTRAS), "add each new notebook's extras to EXTRAS (and its install cell)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_first_code_cell_installs_lpjax_with_its_extras(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    source = _code_cells(nb)[0].source
    lines = source.splitlines()
    assert 'LPJAX_SOURCE = ""  # @param {type:"string"}' in lines[:3], "LPJAX_SOURCE is set at the cell's top"
    assert 'LPJAX_SOURCE = os.environ.get("LPJAX_SOURCE") or LPJAX_SOURCE' in lines, "the environment overrides it"
    extras = _extras(source)
    assert extras == EXTRAS[path.name]
    unknown = set(filter(None, extras.split(","))) - _setup_cfg_extras()
    assert not unknown, f"extras {unknown} are not in setup.cfg"
    assert 'pip_install(f"{lpjax_spec} @ {checkout.as_uri()}")' in source
    assert re.findall(r"sys\.path\.(?:insert|append)\(.*\)", source) == ["sys.path.append(str(checkout))"]
    after = "\n".join(cell.source for cell in _code_cells(nb)[1:])
    assert not re.search(r"sys\.path\.(insert|append)", after), "the install cell alone puts the checkout on sys.path"


def test_install_cells_are_the_same_code():
    without_extras = {
        path.name: re.sub(r'^LPJAX_EXTRAS = ".*$', "", _install_cell(path), flags=re.M) for path in NOTEBOOKS
    }
    reference = without_extras[NOTEBOOKS[0].name]
    differing = [name for name, source in without_extras.items() if source != reference]
    assert not differing, f"the install cell of {differing} differs from {NOTEBOOKS[0].name}'s"


# The install cell run as a script by an interpreter without site-packages (`-S`, so no lpjax or jax installed),
# with `pip install` recorded instead of run, and `git` recorded (a clone makes an empty checkout: lpjax/__init__.py
# and setup.cfg). It stops at `import jax`, after the installs; `path` lists what it added to sys.path.
_HARNESS = r"""
import json, os, subprocess, sys
calls, git, real_run, path_before = [], [], subprocess.run, list(sys.path)
def fake_run(command, *args, **kwargs):
    if list(command[:4]) == [sys.executable, "-m", "pip", "install"]:
        calls.append(command[-1])
        return subprocess.CompletedProcess(command, 0, "", "")
    if command[0] == "git":
        git.append(list(command))
        if command[1] == "clone":
            os.makedirs(os.path.join(command[-1], "lpjax"))
            for name in ("lpjax/__init__.py", "setup.cfg"):
                open(os.path.join(command[-1], name), "w").close()
        return subprocess.CompletedProcess(command, 0, "", "")
    return real_run(command, *args, **kwargs)
subprocess.run = fake_run
try:
    exec(compile(open(sys.argv[1]).read(), "install cell", "exec"), {"__name__": "__main__"})
    status = "done"
except SystemExit as stop:
    status = f"stop: {stop}"
except ModuleNotFoundError as missing:
    status = f"missing {missing.name}"
added = [entry for entry in sys.path if entry not in path_before]
print(json.dumps({"status": status, "pip": calls, "git": git, "path": added, "last": sys.path[-1:] == added}))
"""


def _run_install_cell(tmp_path, cwd, source=None, env=None, path_dirs=(), python_path=(), details=False):
    """(status, pip requirements) of the install cell run in ``cwd`` with ``env`` (added to a clean environment);
    with ``details``, the whole record (also ``git`` commands and the ``path`` entries added)."""
    cell = tmp_path / "install_cell.py"
    cell.write_text(source if source is not None else _install_cell(COLAB / "02_sac_fp16.ipynb"))
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("LPJAX_SOURCE", "JAX_PLATFORMS", "PYTHONPATH", "COLAB_TPU_ADDR", "TPU_ACCELERATOR_TYPE")
    }
    clean["PATH"] = os.pathsep.join([*map(str, path_dirs), clean.get("PATH", "")])
    if python_path:
        clean["PYTHONPATH"] = os.pathsep.join(map(str, python_path))
    run = subprocess.run(
        [sys.executable, "-S", "-c", _HARNESS, str(cell)],
        cwd=cwd,
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    return result if details else (result["status"], result["pip"])


CPU = {"JAX_PLATFORMS": "cpu"}


def test_install_cell_stops_with_one_line_without_a_source(tmp_path):
    status, pip = _run_install_cell(tmp_path, tmp_path, env=CPU)
    assert pip == []
    assert status.startswith("stop: Set LPJAX_SOURCE at the top of this cell") and "\n" not in status, status


@pytest.mark.parametrize("where", ["colab", "repo"])
def test_install_cell_finds_the_checkout_it_is_in(tmp_path, where):
    cwd = COLAB if where == "colab" else REPO_ROOT
    result = _run_install_cell(tmp_path, cwd, env=CPU, details=True)
    assert result["pip"] == [f"lpjax[runs,dmc] @ {REPO_ROOT.as_uri()}"], result
    assert result["status"] == "missing jax" and result["git"] == []
    assert result["path"] == [str(REPO_ROOT)] and result["last"], result  # experiments/ importable, after lpjax's


def test_install_cell_finds_a_clone_in_lpjax(tmp_path):
    content = tmp_path / "content"  # Colab's working directory, after `!git clone <url> lpjax`
    (content / "lpjax" / "lpjax").mkdir(parents=True)
    (content / "lpjax" / "lpjax" / "__init__.py").touch()
    (content / "lpjax" / "setup.cfg").touch()
    result = _run_install_cell(tmp_path, content, env=CPU, details=True)
    assert result["pip"] == [f"lpjax[runs,dmc] @ {(content / 'lpjax').as_uri()}"], result
    assert result["path"] == [str(content / "lpjax")]


@pytest.mark.parametrize(
    "url, repository, ref",
    [
        ("git+https://example.org/org/lpjax.git@main", "https://example.org/org/lpjax.git", "main"),
        ("git+ssh://git@example.org/org/lpjax.git", "ssh://git@example.org/org/lpjax.git", None),
        ("https://example.org/org/lpjax.git", "https://example.org/org/lpjax.git", None),
    ],
)
def test_install_cell_clones_a_git_url_into_lpjax_once(tmp_path, url, repository, ref):
    content = tmp_path / "content"
    content.mkdir()
    result = _run_install_cell(tmp_path, content, env={**CPU, "LPJAX_SOURCE": url}, details=True)
    clone = content / "lpjax"
    assert result["git"][0] == ["git", "clone", "--quiet", repository, str(clone)], result
    assert result["git"][1:] == ([["git", "-C", str(clone), "checkout", "--quiet", ref]] if ref else [])
    assert result["pip"] == [f"lpjax[runs,dmc] @ {clone.as_uri()}"] and result["path"] == [str(clone)], result
    again = _run_install_cell(tmp_path, content, env={**CPU, "LPJAX_SOURCE": url}, details=True)
    assert again["git"] == [] and again["pip"] == result["pip"], again  # ./lpjax exists: installed as it is


@pytest.mark.parametrize("source", ["checkout", "wheel", "missing"])
def test_install_cell_installs_a_checkout_and_refuses_anything_else(tmp_path, source):
    if source == "checkout":
        result = _run_install_cell(tmp_path, tmp_path, env={**CPU, "LPJAX_SOURCE": str(REPO_ROOT)}, details=True)
        assert result["pip"] == [f"lpjax[runs,dmc] @ {REPO_ROOT.as_uri()}"] and result["path"] == [str(REPO_ROOT)]
        return
    wheel = tmp_path / "lpjax-0.1.0-py3-none-any.whl"
    if source == "wheel":  # the notebooks import experiments/, which a wheel does not hold
        wheel.touch()
    status, pip = _run_install_cell(tmp_path, tmp_path, env={**CPU, "LPJAX_SOURCE": str(wheel)})
    assert pip == [] and status.startswith("stop: LPJAX_SOURCE=") and "neither a git URL nor a checkout" in status
    assert "\n" not in status, status


def test_install_cell_source_variable_and_environment(tmp_path):
    source = _install_cell(COLAB / "01_numerics.ipynb")  # LPJAX_EXTRAS = "runs"
    set_in_cell = source.replace('LPJAX_SOURCE = ""', 'LPJAX_SOURCE = "git+https://example.org/cell.git"', 1)
    for name in ("cell", "env"):
        (tmp_path / name).mkdir()
    in_cell = _run_install_cell(tmp_path, tmp_path / "cell", set_in_cell, env=CPU, details=True)
    assert in_cell["git"][0][3] == "https://example.org/cell.git"
    assert in_cell["pip"] == [f"lpjax[runs] @ {(tmp_path / 'cell' / 'lpjax').as_uri()}"]
    environment = {**CPU, "LPJAX_SOURCE": "git+https://example.org/env.git"}
    from_env = _run_install_cell(tmp_path, tmp_path / "env", set_in_cell, env=environment, details=True)
    assert from_env["git"][0][3] == "https://example.org/env.git"


def _fake_dists(root: Path, dists: dict[str, str]) -> Path:
    """A sys.path entry holding only the metadata of ``dists`` ({name: METADATA lines after Name and Version})."""
    for name, extra in dists.items():
        info = root / f"{name.replace('-', '_')}-0.12.0.1.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.12.0.1\n{extra}")
    return root


def _fake_nvidia_smi(root: Path, cuda_version: str | None) -> Path:
    """A folder with an ``nvidia-smi`` that reports a driver for ``cuda_version``, or fails (no GPU) for None."""
    root.mkdir()
    script = root / "nvidia-smi"
    header = f"| NVIDIA-SMI 580.82.07    Driver Version: 580.82.07    CUDA Version: {cuda_version} |"
    script.write_text(f"#!/bin/sh\necho '{header}'\n" if cuda_version else "#!/bin/sh\nexit 9\n")
    script.chmod(0o755)
    return root


JAX_EXTRAS = "Provides-Extra: tpu\nProvides-Extra: cuda\nProvides-Extra: cuda12\nProvides-Extra: cuda13\n"


@pytest.mark.parametrize(
    "driver_cuda, plugin, expected",
    [
        ("12.4", None, "jax[cuda12]==0.12.0.1"),
        ("13.0", None, "jax[cuda13]==0.12.0.1"),
        ("12.4", "jax-cuda12-plugin", None),  # Colab's GPU runtimes: jax comes with its CUDA plugin
    ],
)
def test_install_cell_adds_the_cuda_plugin_on_a_gpu(tmp_path, driver_cuda, plugin, expected):
    dists = {"jax": JAX_EXTRAS, "jaxlib": "", **({plugin: ""} if plugin else {})}
    site = _fake_dists(tmp_path / "site", dists)
    status, pip = _run_install_cell(
        tmp_path,
        tmp_path,
        env={"LPJAX_SOURCE": str(REPO_ROOT)},
        path_dirs=[_fake_nvidia_smi(tmp_path / "bin", driver_cuda)],
        python_path=[site],
    )
    assert pip == [f"lpjax[runs,dmc] @ {REPO_ROOT.as_uri()}"] + ([expected] if expected else []), status
    assert status == "missing jax"


def test_install_cell_adds_libtpu_on_a_tpu_and_nothing_on_a_cpu(tmp_path):
    site = _fake_dists(tmp_path / "site", {"jax": JAX_EXTRAS, "jaxlib": ""})
    source = {"LPJAX_SOURCE": str(REPO_ROOT)}
    tpu = _run_install_cell(
        tmp_path,
        tmp_path,
        env={**source, "TPU_ACCELERATOR_TYPE": "v5litepod-1"},
        path_dirs=[_fake_nvidia_smi(tmp_path / "bin", None)],
        python_path=[site],
    )[1]
    assert tpu == [f"lpjax[runs,dmc] @ {REPO_ROOT.as_uri()}", "jax[tpu]==0.12.0.1"]
    cpu = _run_install_cell(tmp_path, tmp_path, env={**source, **CPU}, python_path=[site])[1]
    assert cpu == [f"lpjax[runs,dmc] @ {REPO_ROOT.as_uri()}"]


# --- the committed outputs --------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_committed_outputs_are_complete_and_current(path):
    """Executed top to bottom from the current sources, at the normal size, without errors, with every figure."""
    nb = nbformat.read(path, as_version=4)
    record = nb.metadata.get("lpjax", {})
    rerun = f"re-run it: python colab/execute.py colab/{path.name}"
    assert record.get("code_sha256") == execute_script.code_sha256(nb), f"{path.name}: outputs are stale; {rerun}"
    assert record.get("notebook_steps") is None, f"{path.name} was saved from a reduced run; {rerun}"
    cells = _code_cells(nb)
    counts = [cell.get("execution_count") for cell in cells]
    assert counts == list(range(1, len(cells) + 1)), f"{path.name}: not one run top to bottom ({counts}); {rerun}"
    errors = [i for i, cell in enumerate(cells) for output in cell.outputs if output.output_type == "error"]
    assert not errors, f"{path.name}: code cells {errors} have error outputs"
    tracebacks = [
        i
        for i, cell in enumerate(cells)
        if any("Traceback (most recent call last)" in text for text in _text_outputs(cell))
    ]
    assert not tracebacks, f"{path.name}: code cells {tracebacks} print a traceback"
    missing = [
        i
        for i, cell in enumerate(cells)
        if _makes_a_figure(cell) and not any("image/png" in output.get("data", {}) for output in cell.outputs)
    ]
    assert not missing, f"{path.name}: code cells {missing} make a figure but have no image output"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_committed_outputs_are_small_and_name_no_local_paths(path):
    assert path.stat().st_size < MAX_NOTEBOOK_BYTES, f"{path.name}: {path.stat().st_size} bytes"
    nb = nbformat.read(path, as_version=4)
    leaks = [
        (i, match.group(0))
        for i, cell in enumerate(_code_cells(nb))
        for text in _text_outputs(cell)
        for match in [LOCAL_PATH.search(text)]
        if match
    ]
    assert not leaks, f"{path.name}: outputs name local paths (code cell, match): {leaks}"


# --- executed in a fresh runtime (`notebooks` marker) ------------------------------------------------------------


@pytest.fixture(scope="session")
def colab_runtime(tmp_path_factory):
    """A fresh virtualenv with only what a Colab runtime brings to run a notebook (ipykernel, nbclient), a copy of
    this checkout (what `git clone` gives) and an empty working directory (Colab's /content)."""
    root = tmp_path_factory.mktemp("colab_runtime")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "ipykernel", "nbclient"],
        check=True,
    )
    checkout = root / "lpjax"
    shutil.copytree(
        REPO_ROOT,
        checkout,
        ignore=shutil.ignore_patterns(
            ".git",
            ".venv*",
            "venv",
            "build",
            "dist",
            "*.egg-info",
            "runs",
            "__pycache__",
            ".pytest_cache",
            ".hypothesis",
            ".ipynb_checkpoints",
            "MUJOCO_LOG.TXT",
        ),
    )
    content = root / "content"
    content.mkdir()
    return SimpleNamespace(venv=venv, python=python, checkout=checkout, content=content)


@pytest.mark.notebooks
@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_runs_in_a_fresh_runtime(path, colab_runtime, tmp_path):
    """The notebook, reduced, top to bottom in a kernel of the fresh virtualenv; its first cell installs lpjax."""
    runtime = colab_runtime
    nb = nbformat.read(path, as_version=4)
    # One more cell: lpjax (its kernels included) comes from the virtualenv, experiments from the checkout.
    nb.cells.append(
        nbformat.v4.new_code_cell(
            "import json, experiments, lpjax, lpjax.kernels\n"
            "print(json.dumps([m.__file__ for m in (lpjax, lpjax.kernels, experiments)]))"
        )
    )
    notebook = tmp_path / "in" / path.name
    notebook.parent.mkdir()
    nbformat.write(nb, notebook)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(
        LPJAX_SOURCE=str(runtime.checkout),
        JAX_PLATFORMS="cpu",
        VIRTUAL_ENV=str(runtime.venv),
        PATH=os.pathsep.join([str(runtime.venv / "bin"), env.get("PATH", "")]),
    )
    run = subprocess.run(
        [
            str(runtime.python),
            str(COLAB / "execute.py"),
            "--steps",
            str(NOTEBOOK_STEPS),
            "--output-dir",
            str(tmp_path / "out"),
            "--cwd",
            str(runtime.content),
            "--cell-timeout",
            "900",
            str(notebook),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if run.returncode:
        log = re.sub(r"\x1b\[[0-9;]*m", "", run.stdout + run.stderr)  # without the traceback's colours
        pytest.fail(f"{path.name} failed in the fresh runtime:\n{log[-6000:]}", pytrace=False)

    cells = _code_cells(nbformat.read(tmp_path / "out" / path.name, as_version=4))
    installed = "".join(_text_outputs(cells[0]))
    assert f"installed {'lpjax[' + EXTRAS[path.name] + ']' if EXTRAS[path.name] else 'lpjax'} " in installed, installed
    files = json.loads(_text_outputs(cells[-1])[0])
    site = str(runtime.venv / "lib")
    assert files[0].startswith(site) and files[1].startswith(site), files
    assert files[2].startswith(str(runtime.checkout / "experiments")), files
    missing = [
        i
        for i, cell in enumerate(cells)
        if _makes_a_figure(cell) and not any("image/png" in output.get("data", {}) for output in cell.outputs)
    ]
    assert not missing, f"code cells {missing} make a figure but show none"


# --- the calls into lpjax, experiments and benchmarks ------------------------------------------------------------

FIRST_PARTY = ("lpjax", "experiments", "benchmarks")


def _imported_names(tree: ast.Module) -> dict[str, str]:
    """The names a notebook binds to first-party modules or objects: ``{name: "package.module[.attribute]"}``."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                package = alias.name.split(".")[0]
                if package in FIRST_PARTY:  # ``import a.b`` binds ``a``; ``import a.b as c`` binds ``c`` to ``a.b``
                    names[alias.asname or package] = alias.name if alias.asname else package
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in FIRST_PARTY:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _resolve(dotted: str):
    """The module or object a dotted first-party path names (importing modules on the way)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as error:
            if error.name.split(".")[0] in FIRST_PARTY:
                continue
            pytest.skip(f"{dotted} needs {error.name}, not installed here")
        for attribute in parts[cut:]:
            obj = getattr(obj, attribute)
        return obj
    raise AttributeError(dotted)


def _dotted(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_every_call_into_lpjax_matches_the_signature_it_calls(path):
    """Every call a notebook makes to a first-party function or class by its imported name (``grpo_fp8.table(r)``,
    ``lpjax.optim.hadam(1e-4)``) names something that exists and binds to its signature: an API change breaks a
    notebook here, in the default tier, not only when ``make test-notebooks`` runs it."""
    cells = _code_cells(nbformat.read(path, as_version=4))
    source = "\n".join(
        line for cell in cells for line in cell.source.splitlines() if not line.lstrip().startswith(("!", "%"))
    )
    tree = ast.parse(source)
    names = _imported_names(tree)
    problems, checked = [], 0
    for node in ast.walk(tree):
        dotted = _dotted(node.func) if isinstance(node, ast.Call) else None
        name, _, attributes = (dotted or "").partition(".")
        if name not in names:
            continue
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            continue
        target = ".".join(filter(None, (names[name], attributes)))
        try:
            function = _resolve(target)
        except AttributeError:
            problems.append(f"{dotted}: {target} does not exist")
            continue
        try:
            signature = inspect.signature(function)
        except (TypeError, ValueError):
            continue
        try:
            signature.bind(*node.args, **{k.arg: k.value for k in node.keywords})
        except TypeError as error:
            problems.append(f"{ast.unparse(node)[:80]}: {error}")
        checked += 1
    assert not problems, f"{path.name}: " + "; ".join(problems)
    assert checked or not names, f"{path.name}: imports {sorted(names)} but no call was checked"


# --- the numerics demo ------------------------------------------------------------------------------------------


def test_numerics_demo_main(tmp_path, capsys):
    """The demo's claims, at 1000 steps (seed 0), with bounds set from measurements (jax 0.10.2, XLA:CPU).

    Measured at 1000 steps, lr 1e-4, seeds 0-2: adam_fp16 nan at step 1; lpjax_fp16 / adam_fp32 final loss
    0.996-0.999 (seed 0: 0.02506 / 0.02516), and 1.19-1.27 for the same chain without Kahan summation;
    hadam_fp16 1.20x fp32 (seed 0).
    """
    from experiments import numerics_demo

    out = tmp_path / "demo"
    record = numerics_demo.main(["--steps=1000", "--seed=0", f"--output_dir={out}", "--no_progress"])
    printed = capsys.readouterr().out
    assert "lpjax_fp16" in printed and "final loss" in printed

    png, saved = out / "learning_curves.png", out / "final_losses.json"
    assert png.stat().st_size > 10_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with open(saved) as f:
        assert json.load(f) == json.loads(json.dumps(record))
    results = record["results"]
    assert set(results) == set(numerics_demo.OPTIMIZERS)
    assert record["config"]["steps"] == 1000

    fp32 = results["adam_fp32"]["final_loss"]
    chain = results["lpjax_fp16"]["final_loss"]
    naive = results["adam_fp16"]["final_loss"]
    hadam = results["hadam_fp16"]["final_loss"]
    assert fp32 is not None and 0.005 < fp32 < 0.1, fp32
    # The lpjax chain trains as well as fp32 (slightly better, see the demo's docstring), never skips a step here.
    assert chain is not None and math.isfinite(chain) and results["lpjax_fp16"]["first_nonfinite_step"] is None
    assert 0.9 < chain / fp32 < 1.1, (chain, fp32)
    assert results["lpjax_fp16"]["skipped_steps"] == 0 and results["lpjax_fp16"]["final_loss_scale"] == 1e4
    # Naive fp16 Adam diverges (v underflows to 0, eps = 0): nan, or at least far worse than fp32.
    assert naive is None or naive > 10 * fp32, naive
    # hAdam alone loses either to nan or to rounded-away updates.
    assert hadam is None or hadam > chain, (hadam, chain)


def test_train_is_reproducible_and_jit_matches_between_chunkings():
    """``train`` depends only on its arguments, and running the scan in different chunk sizes changes nothing."""
    from experiments import numerics_demo

    a = numerics_demo.train("adam_fp32", 40, seed=3)
    b = numerics_demo.run("adam_fp32", 40, seed=3, chunk=20).losses
    assert a.shape == (40,) and np.isfinite(a).all() and (a == b).all()
