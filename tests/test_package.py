"""The package: its public API exists, its modules keep the one-way dependencies of docs/design.md (and
WORKSPACE.md's layout), lpjax never imports ``experiments`` or ``benchmarks``, and the wheel holds ``lpjax/`` only,
with the kernels as ``lpjax.kernels``."""

import ast
import configparser
import email.parser
import json
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

import lpjax

ROOT = pathlib.Path(lpjax.__file__).parent
REPO_ROOT = ROOT.parent
SOURCES = sorted(ROOT.rglob("*.py")) + sorted((REPO_ROOT / "kernels").rglob("*.py"))
"""Every module of the library: lpjax/ and kernels/ (installed as lpjax.kernels)."""

PUBLIC = {
    "lpjax.precision": ["Policy", "get_policy", "POLICIES", "set_policy"],
    "lpjax.optim": [
        "scale_by_hadam",
        "hadam",
        "compound_loss_scaling",
        "loss_scale",
        "scaled_value_and_grad",
        "UnscaledLossWarning",
        "kahan_summation",
        "kahan_polyak",
        "PYTORCH_AMP_DEFAULTS",
    ],
    "lpjax.numerics": ["normal_log_prob", "tanh_log_det_jacobian", "weight_standardize", "hypot"],
    "lpjax.quant": [
        "quantize_fp8_blockwise",
        "dequantize_fp8_blockwise",
        "quantize_fp8_per_token_group",
        "dequantize_fp8_per_token_group",
        "Fp8BlockwiseWeight",
        "quantize_int8",
        "quantize_int8_weight",
        "quantize_int8_per_token",
        "dequantize_int8",
        "Int8Weight",
        "uniform_quantize",
        "uniform_dequantize",
        "quantize_params",
        "dequantize_params",
        "fake_quantize",
        "fake_quantize_params",
        "pack_params",
        "unpack_params",
        "packed_nbytes",
    ],
    "lpjax.inference": ["Int8MLP", "Fp32MLP", "make_policy_runtime"],
    "lpjax.agents.d4pg": ["D4PGConfig", "D4PGState", "init", "update", "act", "actor_network"],
    "lpjax.distributed": [
        "ActorLearner",
        "ActorWorker",
        "RayBackend",
        "InProcessBackend",
        "ParameterServer",
        "SamplesPerInsertLimiter",
        "encode_policy",
        "decode_policy",
        "build_policy",
        "make_backend",
    ],
    "lpjax.nstep": ["NStepAccumulator"],
    "lpjax.nn": ["Dense", "policy_dense", "MLP"],
    "lpjax.inspect": ["precision_report", "PrecisionReport", "Row", "number_format", "NumberFormat", "OpStatistics"],
    "lpjax.kernels": ["fp16_matmul", "fp8_blockwise_matmul", "int8_matmul", "lower_for_cuda"],
    "lpjax.run_logging": ["RunLogger", "read_metrics", "logged_rows", "metrics_path"],
    "lpjax.plots": ["plot_learning_curve", "plot_run_curve"],
    "lpjax.jsonable": ["to_jsonable"],
}


@pytest.mark.parametrize("module, names", PUBLIC.items())
def test_public_names_exist_and_are_documented(module, names):
    mod = __import__(module, fromlist=names)
    for name in names:
        obj = getattr(mod, name)
        if callable(obj):
            assert obj.__doc__ and len(obj.__doc__) > 40, f"{module}.{name} needs a docstring"


# Leaf modules (docs/design.md): they may import from themselves (their own package), lpjax._optional (which
# imports nothing from lpjax: the install hints of optional dependencies) and the modules listed beside them, but
# from nothing else in lpjax. The methods' declaration reads dtype names from lpjax.precision and builds the
# learners' optimizer from lpjax.optim's factory.
LEAVES = {
    "precision.py": ("lpjax.precision",),
    "numerics.py": ("lpjax.numerics",),
    "methods.py": ("lpjax.methods", "lpjax.precision", "lpjax.optim"),
    "optim": ("lpjax.optim",),
    "envs": ("lpjax.envs",),
    "quant": ("lpjax.quant",),
}


@pytest.mark.parametrize("leaf, allowed", LEAVES.items())
def test_leaf_modules_import_nothing_else_from_lpjax(leaf, allowed):
    path = ROOT / leaf
    files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
    for file in files:
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                if (name == "lpjax" or name.startswith("lpjax.")) and name != "lpjax._optional":
                    assert any(name == own or name.startswith(own + ".") for own in allowed), (
                        f"{file.name} imports {name}"
                    )


def test_kernels_depend_on_lpjax_quant_only():
    """kernels/ (lpjax.kernels) sits below lpjax.nn (which uses it): besides its own package, the only lpjax module
    a kernel may import is lpjax.quant."""
    for file in sorted((REPO_ROOT / "kernels").rglob("*.py")):
        for name in _imported_names(file):
            if name == "lpjax" or name.startswith("lpjax."):
                assert name.startswith(("lpjax.quant", "lpjax.kernels")), f"{file.name} imports {name}"
            assert name.partition(".")[0] != "kernels", f"{file.name} imports {name}: use lpjax.kernels"


def _imported_names(file: pathlib.Path) -> list[str]:
    """The absolute module names ``file`` imports (``import a.b``, ``from a.b import c``), anywhere in it."""
    names = []
    for node in ast.walk(ast.parse(file.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
    return names


APPLICATIONS = ("experiments", "benchmarks")
"""What runs from a checkout and uses lpjax: lpjax itself never imports them (they are not installed)."""


@pytest.mark.parametrize("file", SOURCES, ids=[str(f.relative_to(REPO_ROOT)) for f in SOURCES])
def test_lpjax_never_imports_experiments_or_benchmarks(file):
    for name in _imported_names(file):
        assert name.partition(".")[0] not in APPLICATIONS, f"{file.relative_to(REPO_ROOT)} imports {name}"


# Imports every module of lpjax (lpjax.kernels included) in a fresh interpreter started in the repository root,
# where `experiments` and `benchmarks` would import: a module whose optional dependency is missing is skipped.
_IMPORT_ALL = r"""
import importlib, json, pkgutil, sys
import lpjax, lpjax.kernels
imported, skipped = [], {}
for package in (lpjax, lpjax.kernels):
    for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        try:
            importlib.import_module(module.name)
            imported.append(module.name)
        except ModuleNotFoundError as error:
            if (error.name or "").partition(".")[0] in ("lpjax", "experiments", "benchmarks"):
                raise
            skipped[module.name] = error.name
applications = sorted(name for name in sys.modules if name.partition(".")[0] in ("experiments", "benchmarks"))
print(json.dumps({"imported": imported, "skipped": skipped, "applications": applications}))
"""


def test_importing_every_lpjax_module_loads_no_experiments_or_benchmarks():
    run = subprocess.run(
        [sys.executable, "-c", _IMPORT_ALL],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["applications"] == [], result["applications"]
    assert {"lpjax.run_logging", "lpjax.inspect.report", "lpjax.kernels.fp16_matmul", "lpjax.agents.sac"} <= set(
        result["imported"]
    ), result
    assert not set(result["skipped"]) & {"lpjax.run_logging", "lpjax.plots", "lpjax.envs", "lpjax.inference"}


# --- the wheel ---------------------------------------------------------------------------------------------------


def _core_requirements(metadata: str) -> list[str]:
    """The names of the unconditional ``Requires-Dist`` entries of a wheel's METADATA (no ``extra ==`` marker)."""
    message = email.parser.Parser().parsestr(metadata)
    return [req.split(";")[0].strip() for req in message.get_all("Requires-Dist") or [] if "extra ==" not in req]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    """The wheel built from a copy of the checkout (without virtualenvs, runs and build outputs), with the
    setuptools of this interpreter (no build isolation: no package index needed)."""

    def ignore(directory, names):
        top = pathlib.Path(directory) == REPO_ROOT
        return [
            name
            for name in names
            if name == "__pycache__"
            or top
            and (name.startswith(".") or name in ("runs", "build", "dist") or name.endswith(".egg-info"))
        ]

    source, out = tmp_path_factory.mktemp("source") / "lpjax", tmp_path_factory.mktemp("wheel")
    shutil.copytree(REPO_ROOT, source, ignore=ignore)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "--disable-pip-version-check",
            "-w",
            str(out),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (path,) = out.glob("lpjax-*.whl")
    with zipfile.ZipFile(path) as archive:
        yield archive


@pytest.mark.xdist_group("wheel")  # one build
def test_wheel_holds_lpjax_only_with_the_kernels_inside(wheel):
    names = wheel.namelist()
    top_level = {name.split("/")[0] for name in names}
    dist_info = [name for name in top_level if name.endswith(".dist-info")]
    assert len(dist_info) == 1 and top_level == {"lpjax", *dist_info}, sorted(top_level)
    assert "lpjax/kernels/fp16_matmul.py" in names
    kernels = REPO_ROOT / "kernels"
    expected = {f"lpjax/{f.relative_to(ROOT).as_posix()}" for f in ROOT.rglob("*.py")} | {
        f"lpjax/kernels/{f.relative_to(kernels).as_posix()}" for f in kernels.rglob("*.py")
    }
    missing = sorted(expected - set(names))
    assert not missing, f"modules missing from the wheel (add their package to setup.cfg's packages): {missing}"


@pytest.mark.xdist_group("wheel")  # one build
def test_core_install_needs_no_plotting_or_tensorboard(wheel):
    """``pip install lpjax`` brings the library's core; what runs write (plots, TensorBoard events) is the ``runs``
    extra, and every extra of setup.cfg is declared in the wheel."""
    (metadata,) = [name for name in wheel.namelist() if name.endswith(".dist-info/METADATA")]
    text = wheel.read(metadata).decode()
    core = {
        name.split(">")[0].split("=")[0].split("<")[0].split("[")[0].strip().lower()
        for name in _core_requirements(text)
    }
    assert "jax" in core and "flax" in core
    assert not core & {"matplotlib", "tensorboardx"}, core
    config = configparser.ConfigParser()
    config.read(REPO_ROOT / "setup.cfg")
    extras = set(email.parser.Parser().parsestr(text).get_all("Provides-Extra") or [])
    assert extras == set(config["options.extras_require"]) and "runs" in extras
