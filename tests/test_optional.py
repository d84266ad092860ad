"""lpjax._optional: an optional dependency that is not installed fails with one line naming its extra, wherever
lpjax imports it."""

import sys

import pytest

from lpjax._optional import check, missing, require


def hide(monkeypatch, module_name: str) -> None:
    """Makes ``module_name`` and its submodules unimportable, as if the package were not installed."""
    for name in [name for name in sys.modules if name.startswith(module_name + ".")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, module_name, None)


def test_require_imports_an_installed_module_and_check_passes():
    import json.decoder

    assert require("json.decoder", "runs") is json.decoder
    check("json", "runs")


def test_a_missing_module_names_its_top_level_package_and_extra(monkeypatch):
    hide(monkeypatch, "json")
    expected = "json is not installed: pip install 'lpjax[dmc]'"
    for call in (
        lambda: require("json", "dmc"),
        lambda: require("json.decoder", "dmc"),
        lambda: check("json.decoder", "dmc"),
    ):
        with pytest.raises(ModuleNotFoundError) as error:
            call()
        assert str(error.value) == expected and error.value.name == "json"
    assert str(missing("ray", "distributed")) == "ray is not installed: pip install 'lpjax[distributed]'"


def test_a_module_failing_inside_an_installed_package_is_not_blamed_on_the_extra(tmp_path, monkeypatch):
    (tmp_path / "broken_pkg").mkdir()
    (tmp_path / "broken_pkg" / "__init__.py").write_text("import a_dependency_nobody_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="No module named 'a_dependency_nobody_installed'"):
        require("broken_pkg", "dmc")


def _plot(tmp_path):
    from lpjax.plots import plot_learning_curve
    from lpjax.run_logging import RunLogger

    with RunLogger(tmp_path, tensorboard=False) as logger:
        logger.log(1, {"return": 1.0}, prefix="eval")
    plot_learning_curve(tmp_path, tmp_path / "curve.png")


def _run_logger(tmp_path):
    from lpjax.run_logging import RunLogger

    RunLogger(tmp_path)


def _ray(tmp_path):
    from lpjax.distributed.backends import RayBackend

    RayBackend([])


def _int8_session(tmp_path):
    from lpjax.inference import ort_int8

    ort_int8.inference_session(b"", threads=1)


def _int8_graph(tmp_path):
    import numpy as np

    from lpjax.inference import ort_int8

    ort_int8.int8_mlp_onnx([(np.zeros((2, 2), np.int8), np.ones(2, np.float32), None)], "u8s8")


def _env(name):
    def make(tmp_path):
        import lpjax.envs

        lpjax.envs.make(name, seed=0)

    return make


# (what lpjax does, the module hidden, the extra named)
USES = {
    "dm_control": (_env("dmc:cheetah-run"), "dm_control", "dmc"),
    "mujoco (dm_control's)": (_env("dmc:cheetah-run"), "mujoco", "dmc"),
    "brax": (_env("brax:halfcheetah"), "brax", "brax"),
    "playground": (_env("mjx:cartpole-swingup"), "mujoco_playground", "mjx"),
    "ray": (_ray, "ray", "distributed"),
    "onnxruntime": (_int8_session, "onnxruntime", "int8"),
    "onnx": (_int8_graph, "onnx", "int8"),
    "matplotlib": (_plot, "matplotlib", "runs"),
    "tensorboardX": (_run_logger, "tensorboardX", "runs"),
}


@pytest.mark.parametrize("use, module, extra", USES.values(), ids=USES.keys())
def test_lpjax_names_the_extra_of_a_missing_dependency(tmp_path, monkeypatch, use, module, extra):
    hide(monkeypatch, module)
    with pytest.raises(ModuleNotFoundError) as error:
        use(tmp_path)
    assert str(error.value) == f"{module} is not installed: pip install 'lpjax[{extra}]'"
