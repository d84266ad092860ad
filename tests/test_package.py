"""The public API named in the issues exists, and the leaf modules keep DESIGN.md's one-way dependencies."""

import ast
import pathlib

import pytest

import lpjax

ROOT = pathlib.Path(lpjax.__file__).parent

PUBLIC = {
    "lpjax.precision": ["Policy", "get_policy", "POLICIES"],
    "lpjax.optim": ["scale_by_hadam", "hadam", "compound_loss_scaling", "loss_scale", "kahan_summation",
                    "kahan_polyak", "PYTORCH_AMP_DEFAULTS"],
    "lpjax.numerics": ["softplus", "normal_log_prob", "tanh_normal_log_prob", "weight_standardize", "hypot"],
    "lpjax.quant": ["quantize_fp8_blockwise", "dequantize_fp8_blockwise", "quantize_fp8_per_token_group",
                    "dequantize_fp8_per_token_group", "Fp8BlockwiseWeight", "quantize_int8", "quantize_int8_weight",
                    "quantize_int8_per_token", "dequantize_int8", "Int8Weight", "uniform_quantize",
                    "uniform_dequantize", "quantize_params", "dequantize_params", "fake_quantize",
                    "fake_quantize_params", "pack_params", "unpack_params", "packed_nbytes"],
    "lpjax.inference": ["Int8MLP", "Fp32MLP", "make_policy_runtime"],
    "lpjax.agents.d4pg": ["D4PGConfig", "D4PGState", "init", "update", "act", "actor_network"],
    "lpjax.distributed": ["ActorLearner", "ActorWorker", "RayBackend", "InProcessBackend", "ParameterServer",
                          "SamplesPerInsertLimiter", "encode_policy", "decode_policy", "build_policy",
                          "make_backend"],
    "lpjax.nstep": ["NStepAccumulator"],
    "lpjax.nn": ["Dense", "policy_dense", "MLP"],
    "lpjax.inspect": ["precision_report", "PrecisionReport", "Row", "number_format", "NumberFormat", "OpStatistics"],
    "kernels": ["fp16_matmul", "fp8_blockwise_matmul", "int8_matmul"],
}


@pytest.mark.parametrize("module, names", PUBLIC.items())
def test_public_names_exist_and_are_documented(module, names):
    mod = __import__(module, fromlist=names)
    for name in names:
        obj = getattr(mod, name)
        if callable(obj):
            assert obj.__doc__ and len(obj.__doc__) > 40, f"{module}.{name} needs a docstring"


# Leaf modules of DESIGN.md: they may import from themselves (their own package) but from nothing else in lpjax.
LEAVES = {"precision.py": "lpjax.precision", "numerics.py": "lpjax.numerics", "optim": "lpjax.optim",
          "envs": "lpjax.envs", "quant": "lpjax.quant"}


@pytest.mark.parametrize("leaf, own", LEAVES.items())
def test_leaf_modules_import_nothing_else_from_lpjax(leaf, own):
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
                if name == "lpjax" or name.startswith("lpjax."):
                    assert name == own or name.startswith(own + "."), f"{file.name} imports {name}"


def test_kernels_depend_on_lpjax_quant_only():
    """kernels/ sits below lpjax.nn (which uses it): the only lpjax module a kernel may import is lpjax.quant."""
    for file in sorted((ROOT.parent / "kernels").rglob("*.py")):
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lpjax"):
                assert node.module.startswith("lpjax.quant"), f"{file.name} imports {node.module}"
