"""lpjax/inference: the ONNX Runtime int8 policy runtime against its NumPy model (bit for bit) and float64 NumPy
forwards of the dequantized int8 weights, the JAX fp32 runtime, runtime selection and the error for a missing package,
parameter validation, and what importing the package loads."""

import ast
import pathlib
import pickle
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import pytest

from lpjax import inference
from lpjax.inference import Fp32MLP, Int8MLP, check_runtime, make_policy_runtime, ort_int8
from lpjax.kernels import int8_matmul
from lpjax.nn import MLP
from lpjax.quant import Int8Weight, quantize_int8_weight

OBS, ACT, HIDDEN = 24, 6, (128, 128, 128)


@pytest.fixture(scope="module")
def params():
    return MLP(HIDDEN, ACT).init(jax.random.PRNGKey(1), jnp.zeros((1, OBS)))


@pytest.fixture(scope="module")
def runtime(params):
    return Int8MLP.from_params(params, "none")


def obs_batches(batch, count=16, seed=0, dim=OBS):
    return np.random.default_rng(seed).normal(size=(count, batch, dim)).astype(np.float32)


def forward64(layers, x, output_activation="none"):
    """Float64 NumPy forward of ``[(kernel, bias), ...]``: relu hidden layers."""
    x = np.asarray(x, np.float64)
    for i, (w, b) in enumerate(layers):
        x = x @ np.asarray(w, np.float64) + (0.0 if b is None else np.asarray(b, np.float64))
        if i < len(layers) - 1:
            x = np.maximum(x, 0.0)
    return np.tanh(x) if output_activation == "tanh" else x


def float_layers(params):
    tree = params["params"]
    return [(tree[f"Dense_{i}"]["kernel"], tree[f"Dense_{i}"]["bias"]) for i in range(len(tree))]


def rel_rms(errors, refs):
    return float(np.sqrt(np.mean(np.square(errors))) / np.sqrt(np.mean(np.square(refs))))


def jax_int8_reference(runtime, x):
    """lpjax's int8 maths: per-token symmetric int8 activations, ``lpjax.kernels.int8_matmul(impl="reference")``."""
    h = jnp.asarray(x)
    for i, (codes, scales, bias) in enumerate(runtime.layers):
        h = int8_matmul(
            h, Int8Weight(jnp.asarray(codes), jnp.asarray(scales)), bias=jnp.asarray(bias), impl="reference"
        )
        h = jax.nn.relu(h) if i < len(runtime.layers) - 1 else h
    return np.asarray(h)


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return []


# ------------------------------------------------------------------------------------------------------ accuracy


@pytest.mark.parametrize("gemm", ["u8s8", "u8u8"])
@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("output_activation", ["none", "tanh"])
def test_equals_numpy_model_bit_for_bit(params, gemm, batch, output_activation):
    """The runtime computes exactly the documented activation quantization, with either GEMM."""
    rt = Int8MLP.from_params(params, output_activation, gemm=gemm)
    for x in obs_batches(batch, count=4):
        y = rt(x)
        assert y.dtype == np.float32 and y.shape == (batch, ACT)
        np.testing.assert_array_equal(y, rt.reference(x))


@pytest.mark.parametrize("magnitude", [0.0, 1e-44, 1e-40, 1e-30, 1e-4, 1e4, 1e30])
@pytest.mark.parametrize("sign", [-1, 0, 1])
def test_numpy_model_holds_over_the_float32_range(runtime, magnitude, sign):
    """Zero, subnormal (down to a scale that underflows to 0), tiny, huge, one-signed and mixed inputs."""
    x = magnitude * obs_batches(2, count=1, seed=3)[0]
    x = np.abs(x) * sign if sign else x
    np.testing.assert_array_equal(runtime(x), runtime.reference(x))


def test_gemm_kinds_agree_bit_for_bit(params, runtime):
    unsigned = Int8MLP.from_quantized(runtime.layers, "none", gemm="u8u8")
    for x in obs_batches(8, count=4):
        np.testing.assert_array_equal(unsigned(x), runtime(x))


@pytest.mark.parametrize("batch", [1, 8])
def test_single_layer_error_is_only_activation_rounding(batch):
    """One layer against float64 with the dequantized weights: ``|err| <= s/2 * sum_k |w_kn|`` with the per-tensor
    uint8 step ``s = (max(x, 0) - min(x, 0)) / 255``."""
    rng = np.random.default_rng(batch)
    w = rng.normal(size=(64, 32)).astype(np.float32) / 8
    b = rng.normal(size=(32,)).astype(np.float32)
    qw = quantize_int8_weight(jnp.asarray(w))
    rt = Int8MLP.from_quantized([(np.asarray(qw.codes), np.asarray(qw.scales), b)], "none")
    w_deq = rt.dequantized_layers()[0][0]
    for x in obs_batches(batch, count=8, dim=64, seed=batch):
        x[0, :5] = 3.0 * np.abs(x[0, :5])  # a skewed range: lo != -hi
        err = np.abs(rt(x) - forward64([(w_deq, b)], x))
        step = (max(x.max(), 0.0) - min(x.min(), 0.0)) / 255
        bound = 0.5 * step * np.abs(w_deq).sum(axis=0) * (1 + 1e-4) + 1e-5
        assert (err <= bound[None, :]).all(), (err / bound).max()
        assert err.max() > 0  # a real quantization happened


@pytest.mark.parametrize("batch", [1, 8])
def test_close_to_float64_dequantized_and_to_fp32(params, runtime, batch):
    """Multi-layer: within 2% (relative RMS) of the same int8 weights with exact activations, 4% of fp32."""
    deq, fp32 = runtime.dequantized_layers(), float_layers(params)
    errs_deq, errs_fp32, refs = [], [], []
    for x in obs_batches(batch):
        y, ref = runtime(x), forward64(deq, x)
        errs_deq.append(y - ref)
        errs_fp32.append(y - forward64(fp32, x))
        refs.append(ref)
    assert rel_rms(errs_deq, refs) < 0.02
    assert rel_rms(errs_fp32, refs) < 0.04
    assert np.abs(errs_fp32).max() < 0.1 * np.abs(refs).max()


def test_batch_one_is_finer_than_per_token_symmetric_int8(runtime):
    """At batch 1 the uint8 step max/255 on post-relu inputs is half of lpjax's symmetric max/127."""
    deq = runtime.dequantized_layers()
    ours, lpjax_ref, refs = [], [], []
    for x in obs_batches(1, count=32):
        ref = forward64(deq, x)
        ours.append(runtime(x) - ref)
        lpjax_ref.append(jax_int8_reference(runtime, x) - ref)
        refs.append(ref)
    assert rel_rms(ours, refs) < 0.9 * rel_rms(lpjax_ref, refs)


def test_batch_shares_one_activation_scale(runtime):
    """The whole batch is quantized with one range: a row's result depends on the other rows."""
    x = obs_batches(8, count=1)[0]
    x[0] *= 50.0
    together, alone = runtime(x)[1:], np.stack([runtime(row) for row in x[1:]])
    assert not np.array_equal(together, alone)
    np.testing.assert_array_equal(runtime.reference(x)[1:], together)


def test_tanh_output_vector_obs_and_empty_batch(params, runtime):
    rt = Int8MLP.from_params(params, "tanh")
    x = obs_batches(1, count=1)[0, 0]
    y = rt(x)
    assert y.shape == (ACT,) and y.dtype == np.float32
    np.testing.assert_array_equal(y, np.tanh(runtime(x)))
    np.testing.assert_array_equal(rt(x.astype(np.float64)), y)
    assert runtime(np.zeros((0, OBS), np.float32)).shape == (0, ACT)


# ------------------------------------------------------------------------------------------- construction paths


def test_from_quantized_equals_from_params(params, runtime):
    layers = []
    for kernel, bias in float_layers(params):
        qw = quantize_int8_weight(kernel)
        layers.append((np.asarray(qw.codes), np.asarray(qw.scales), np.asarray(bias)))
    rt = Int8MLP.from_quantized(layers, "none")
    for (c1, s1, b1), (c2, s2, b2) in zip(rt.layers, runtime.layers):
        np.testing.assert_array_equal(c1, c2)
        np.testing.assert_array_equal(s1, s2)
        np.testing.assert_array_equal(b1, b2)
    for x in obs_batches(8, count=2):
        np.testing.assert_array_equal(rt(x), runtime(x))


@pytest.mark.parametrize("gemm, offset", [("u8s8", 0), ("u8u8", 128)])
def test_weights_reach_the_onnx_graph_bit_for_bit(runtime, gemm, offset):
    graph = onnx.load_from_string(ort_int8.int8_mlp_onnx(runtime.layers, gemm)).graph
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
    assert [n.op_type for n in graph.node] == ["DynamicQuantizeMatMul", "Relu"] * (len(HIDDEN)) + [
        "DynamicQuantizeMatMul"
    ]
    for i, (codes, scales, bias) in enumerate(runtime.layers):
        np.testing.assert_array_equal(weights[f"codes_{i}"].astype(np.int16) - offset, codes)
        np.testing.assert_array_equal(weights[f"scales_{i}"], scales)
        np.testing.assert_array_equal(weights[f"bias_{i}"], bias)
        assert weights.get(f"zero_point_{i}", 0) == offset


def test_gemm_auto_avoids_saturation(params):
    saturates = inference.u8s8_saturates()
    assert isinstance(saturates, bool)
    assert Int8MLP.from_params(params).gemm == ("u8u8" if saturates else "u8s8")
    if {"avx512_vnni", "avx_vnni"} & set(cpu_flags()):
        assert not saturates  # vpdpbusd accumulates in int32


def test_threads_belong_to_the_session(params):
    one, default = Int8MLP.from_params(params), Int8MLP.from_params(params, threads=None)
    assert one.threads == 1 and one._session.get_session_options().intra_op_num_threads == 1
    assert default.threads is None and default._session.get_session_options().intra_op_num_threads == 0
    x = obs_batches(8, count=1)[0]
    np.testing.assert_array_equal(one(x), default(x))


def test_fp32_runtime_matches_lpjax_mlp(params):
    rt = Fp32MLP.from_params(params)
    for x in obs_batches(8, count=2):
        np.testing.assert_allclose(rt(x), np.tanh(MLP(HIDDEN, ACT).apply(params, x)), rtol=1e-6, atol=1e-6)
    assert rt(x[0]).shape == (ACT,)


def test_make_policy_runtime(params):
    int8 = make_policy_runtime(params, "int8", output_activation="none", gemm="u8u8")
    fp32 = make_policy_runtime(params, "fp32", output_activation="none")
    assert isinstance(int8, Int8MLP) and int8.gemm == "u8u8" and isinstance(fp32, Fp32MLP)
    assert int8.nbytes < fp32.nbytes / 3.5
    x = obs_batches(1, count=1)[0]
    np.testing.assert_allclose(int8(x), fp32(x), atol=0.1 * np.abs(fp32(x)).max())
    with pytest.raises(ValueError, match="runtime must be one of"):
        make_policy_runtime(params, "int4")
    with pytest.raises(ValueError, match="no extra options"):
        make_policy_runtime(params, "fp32", threads=1)
    assert [check_runtime(kind) for kind in inference.RUNTIMES] == ["int8", "fp32"]


@pytest.mark.parametrize("missing", ort_int8.REQUIRED_PACKAGES)
def test_a_missing_package_is_one_line_with_the_install_command(params, monkeypatch, missing):
    monkeypatch.setitem(sys.modules, missing, None)  # `import` and find_spec now fail as if it were not installed
    builders = (
        lambda: Int8MLP.from_params(params),
        lambda: make_policy_runtime(params, "int8"),
        lambda: check_runtime("int8"),
    )
    for build in builders:
        with pytest.raises(ImportError) as error:
            build()
        assert str(error.value) == f"{missing} is not installed: pip install 'lpjax[int8]'"
    assert isinstance(make_policy_runtime(params, "fp32"), Fp32MLP)  # JAX's runtime needs neither


def test_pickles_by_rebuilding(runtime):
    clone = pickle.loads(pickle.dumps(runtime))
    x = obs_batches(8, count=1)[0]
    np.testing.assert_array_equal(clone(x), runtime(x))
    assert repr(clone) == repr(runtime)


# ------------------------------------------------------------------------------------------------------ errors


def _tree(params, **changes):
    tree = {name: dict(layer) for name, layer in params["params"].items()}
    for name, layer in changes.items():
        if layer is None:
            del tree[name]
        else:
            tree[name] = layer
    return tree


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(Dense_1=None), "Dense_0 .. Dense_2"),
        (dict(Dense_9={"kernel": np.zeros((6, 6), np.float32)}), "Dense_0 .. Dense_4"),
        (dict(head={"kernel": np.zeros((6, 6), np.float32)}), "Unexpected entry 'head'"),
        (dict(Dense_0={"bias": np.zeros(128, np.float32)}), "must be a mapping with a 'kernel'"),
        (dict(Dense_0={"kernel": np.zeros((24, 128), np.float32), "scale": 1.0}), "unexpected entries"),
        (dict(Dense_0={"kernel": np.zeros((24, 128, 1), np.float32)}), "floating \\(K, N\\) matrix"),
        (dict(Dense_0={"kernel": np.zeros((24, 128), np.int32)}), "floating \\(K, N\\) matrix"),
        (dict(Dense_0={"kernel": np.zeros((24, 128), np.float32), "bias": np.zeros(7, np.float32)}), "bias must"),
        (dict(Dense_1={"kernel": np.zeros((100, 128), np.float32)}), "Layer 0 outputs 128 features but layer 1"),
    ],
)
def test_malformed_params_raise(params, change, match):
    tree = _tree(params, **change)
    with pytest.raises(ValueError, match=match):
        Int8MLP.from_params(tree)
    with pytest.raises(ValueError, match=match):
        Fp32MLP.from_params({"params": tree})


def test_malformed_arguments_raise(params, runtime):
    codes, scales, bias = runtime.layers[0]
    with pytest.raises(TypeError, match="mapping"):
        Int8MLP.from_params([1, 2])
    with pytest.raises(ValueError, match="no layers"):
        Int8MLP.from_params({})
    with pytest.raises(TypeError, match="from_params"):
        Int8MLP.from_quantized(params)
    with pytest.raises(ValueError, match="empty"):
        Int8MLP.from_quantized([])
    with pytest.raises(ValueError, match="codes must be an int8"):
        Int8MLP.from_quantized([(codes.astype(np.int16), scales, bias)])
    with pytest.raises(ValueError, match="scales must be float32"):
        Int8MLP.from_quantized([(codes, scales[:-1], bias)])
    with pytest.raises(ValueError, match="positive and finite"):
        Int8MLP.from_quantized([(codes, -scales, bias)])
    with pytest.raises(ValueError, match="bias must be floating"):
        Int8MLP.from_quantized([(codes, scales, bias[:3])])
    with pytest.raises(ValueError, match="bias must be finite"):
        Int8MLP.from_quantized([(codes, scales, np.full_like(bias, np.inf))])
    with pytest.raises(ValueError, match="tuple"):
        Int8MLP.from_quantized([(codes, scales)])
    with pytest.raises(ValueError, match="Layer 0 outputs"):
        Int8MLP.from_quantized([runtime.layers[0], runtime.layers[0]])
    with pytest.raises(ValueError, match="output_activation"):
        Int8MLP.from_params(params, "relu")
    with pytest.raises(ValueError, match="gemm must be one of"):
        Int8MLP.from_params(params, gemm="s8s8")
    with pytest.raises(ValueError, match="gemm must be one of"):
        ort_int8.int8_mlp_onnx(runtime.layers, "auto")
    with pytest.raises(ValueError, match="threads"):
        Int8MLP.from_params(params, threads=0)
    with pytest.raises(ValueError, match="threads"):
        Int8MLP.from_params(params, threads=True)
    with pytest.raises(ValueError, match=r"obs must have shape \(24,\) or \(B, 24\)"):
        runtime(np.zeros((2, 23), np.float32))
    with pytest.raises(ValueError, match="obs must have shape"):
        runtime(np.zeros((1, 2, 24), np.float32))
    with pytest.raises(ValueError, match="obs must have shape"):
        Fp32MLP.from_params(params)(np.zeros((23,), np.float32))
    with pytest.raises(ValueError, match="finite"):
        runtime(np.full((24,), np.nan, np.float32))
    with pytest.raises(ValueError, match="finite"):
        runtime.reference(np.full((24,), np.inf, np.float32))
    layers = [(codes, scales, None)]  # a bias may be absent
    rt = Int8MLP.from_quantized(layers, "none")
    x = np.ones(OBS)
    assert rt(x).shape == (HIDDEN[0],)
    np.testing.assert_array_equal(rt(x), rt.reference(x))


# ------------------------------------------------------------------------------------------------------ imports


def test_imports_no_runtime_library_nor_lpjax_beyond_quant():
    code = (
        "import sys, lpjax.inference; loaded = {'onnxruntime', 'onnx', 'torch'} & set(sys.modules); "
        "assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    package = pathlib.Path(inference.__file__).parent
    for file in package.rglob("*.py"):
        for node in ast.walk(ast.parse(file.read_text())):
            names = (
                [node.module]
                if isinstance(node, ast.ImportFrom) and node.module
                else ([a.name for a in node.names] if isinstance(node, ast.Import) else [])
            )
            for name in names:
                if name.startswith("lpjax"):
                    allowed = ("lpjax.quant", "lpjax.inference", "lpjax._optional")  # _optional: the install hints
                    assert name.startswith(allowed), f"{file.name} imports {name}"
