"""lpjax/inference/int8_mlp.py: the fbgemm int8 policy runtime against float64 NumPy forwards, the JAX fp32 runtime,
parameter validation, and the process-global torch settings it touches."""

import ast
import pathlib
import pickle
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels import int8_matmul
from lpjax import inference
from lpjax.inference import Fp32MLP, Int8MLP, make_policy_runtime
from lpjax.nn import MLP
from lpjax.quant import Int8Weight, quantize_int8_weight

torch = pytest.importorskip("torch")

OBS, ACT, HIDDEN = 24, 6, (128, 128, 128)


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    """Int8MLP(threads=1) sets torch's thread count for the whole process: put it back after each test."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def params():
    return MLP(HIDDEN, ACT).init(jax.random.PRNGKey(1), jnp.zeros((1, OBS)))


@pytest.fixture(scope="module")
def runtime(params):
    return Int8MLP.from_params(params, "none", reduce_range=False)


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
    """lpjax's int8 maths: per-token symmetric int8 activations, ``kernels.int8_matmul(impl="reference")``."""
    h = jnp.asarray(x)
    for i, (codes, scales, bias) in enumerate(runtime.layers):
        h = int8_matmul(h, Int8Weight(jnp.asarray(codes), jnp.asarray(scales)), bias=jnp.asarray(bias),
                        impl="reference")
        h = jax.nn.relu(h) if i < len(runtime.layers) - 1 else h
    return np.asarray(h)


# ------------------------------------------------------------------------------------------------------ accuracy


@pytest.mark.parametrize("reduce_range", [False, True])
@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("output_activation", ["none", "tanh"])
def test_matches_numpy_model_of_fbgemm(params, reduce_range, batch, output_activation):
    """The runtime computes exactly the documented activation quantization (up to float32 rounding)."""
    rt = Int8MLP.from_params(params, output_activation, reduce_range=reduce_range)
    for x in obs_batches(batch, count=4):
        y = rt(x)
        assert y.dtype == np.float32 and y.shape == (batch, ACT)
        np.testing.assert_allclose(y, rt.reference(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("reduce_range", [False, True])
@pytest.mark.parametrize("batch", [1, 8])
def test_single_layer_error_is_only_activation_rounding(reduce_range, batch):
    """One layer against float64 with the dequantized weights: ``|err| <= s/2 * sum_k |w_kn|`` with fbgemm's
    per-tensor uint8 step ``s = (max(x, 0) - min(x, 0)) / 255`` (127 with reduce_range)."""
    rng = np.random.default_rng(batch)
    w = rng.normal(size=(64, 32)).astype(np.float32) / 8
    b = rng.normal(size=(32,)).astype(np.float32)
    qw = quantize_int8_weight(jnp.asarray(w))
    rt = Int8MLP.from_quantized([(np.asarray(qw.codes), np.asarray(qw.scales), b)], "none",
                                reduce_range=reduce_range)
    w_deq = rt.dequantized_layers()[0][0]
    for x in obs_batches(batch, count=8, dim=64, seed=batch):
        x[0, :5] = 3.0 * np.abs(x[0, :5])  # a skewed range: lo != -hi
        err = np.abs(rt(x) - forward64([(w_deq, b)], x))
        step = (max(x.max(), 0.0) - min(x.min(), 0.0)) / (127 if reduce_range else 255)
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
    """At batch 1 fbgemm's uint8 step max/255 on post-relu inputs is half of lpjax's symmetric max/127."""
    deq = runtime.dequantized_layers()
    ours, lpjax_ref, refs = [], [], []
    for x in obs_batches(1, count=32):
        ref = forward64(deq, x)
        ours.append(runtime(x) - ref)
        lpjax_ref.append(jax_int8_reference(runtime, x) - ref)
        refs.append(ref)
    assert rel_rms(ours, refs) < 0.9 * rel_rms(lpjax_ref, refs)


def test_batch_shares_one_activation_scale(runtime):
    """fbgemm quantizes the whole batch with one range: a row's result depends on the other rows."""
    x = obs_batches(8, count=1)[0]
    x[0] *= 50.0
    together, alone = runtime(x)[1:], np.stack([runtime(row) for row in x[1:]])
    assert not np.array_equal(together, alone)
    np.testing.assert_allclose(runtime.reference(x)[1:], together, rtol=1e-5, atol=1e-5)


def test_tanh_output_and_vector_obs(params, runtime):
    rt = Int8MLP.from_params(params, "tanh", reduce_range=False)
    x = obs_batches(1, count=1)[0, 0]
    y = rt(x)
    assert y.shape == (ACT,) and y.dtype == np.float32
    np.testing.assert_allclose(y, np.tanh(runtime(x)), rtol=1e-6, atol=1e-6)
    assert runtime(np.zeros((0, OBS), np.float32)).shape == (0, ACT)


def test_tiny_input_range_hits_fbgemm_scale_floor(runtime):
    """Below a range of 255 * 6.1e-5 fbgemm's step stops shrinking; the NumPy model reproduces that too."""
    x = (1e-4 * obs_batches(1, count=1)[0]).astype(np.float32)
    np.testing.assert_allclose(runtime(x), runtime.reference(x), rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------------------------------------- construction paths


def test_from_quantized_equals_from_params(params, runtime):
    layers = []
    for kernel, bias in float_layers(params):
        qw = quantize_int8_weight(kernel)
        layers.append((np.asarray(qw.codes), np.asarray(qw.scales), np.asarray(bias)))
    rt = Int8MLP.from_quantized(layers, "none", reduce_range=False)
    for (c1, s1, b1), (c2, s2, b2) in zip(rt.layers, runtime.layers):
        np.testing.assert_array_equal(c1, c2)
        np.testing.assert_array_equal(s1, s2)
        np.testing.assert_array_equal(b1, b2)
    for x in obs_batches(8, count=2):
        np.testing.assert_array_equal(rt(x), runtime(x))


def test_weights_reach_fbgemm_bit_for_bit(runtime):
    codes, scales, _ = runtime.layers[1]
    weight, _ = torch.ops.quantized.linear_unpack(runtime._packed[1])
    np.testing.assert_array_equal(weight.int_repr().numpy().T, codes)
    np.testing.assert_array_equal(weight.q_per_channel_scales().numpy().astype(np.float32), scales)
    assert not weight.q_per_channel_zero_points().any()


def test_fp32_runtime_matches_lpjax_mlp(params):
    rt = Fp32MLP.from_params(params)
    for x in obs_batches(8, count=2):
        np.testing.assert_allclose(rt(x), np.tanh(MLP(HIDDEN, ACT).apply(params, x)), rtol=1e-6, atol=1e-6)
    assert rt(x[0]).shape == (ACT,)


def test_make_policy_runtime(params):
    int8 = make_policy_runtime(params, "int8", output_activation="none", reduce_range=True)
    fp32 = make_policy_runtime(params, "fp32", output_activation="none")
    assert isinstance(int8, Int8MLP) and int8.reduce_range and isinstance(fp32, Fp32MLP)
    assert int8.nbytes < fp32.nbytes / 3.5
    x = obs_batches(1, count=1)[0]
    np.testing.assert_allclose(int8(x), fp32(x), atol=0.1 * np.abs(fp32(x)).max())
    with pytest.raises(ValueError, match="kind must be one of"):
        make_policy_runtime(params, "int4")
    with pytest.raises(ValueError, match="no extra options"):
        make_policy_runtime(params, "fp32", threads=1)


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


@pytest.mark.parametrize("change, match", [
    (dict(Dense_1=None), "Dense_0 .. Dense_2"),
    (dict(Dense_9={"kernel": np.zeros((6, 6), np.float32)}), "Dense_0 .. Dense_4"),
    (dict(head={"kernel": np.zeros((6, 6), np.float32)}), "Unexpected entry 'head'"),
    (dict(Dense_0={"bias": np.zeros(128, np.float32)}), "must be a mapping with a 'kernel'"),
    (dict(Dense_0={"kernel": np.zeros((24, 128), np.float32), "scale": 1.0}), "unexpected entries"),
    (dict(Dense_0={"kernel": np.zeros((24, 128, 1), np.float32)}), "floating \\(K, N\\) matrix"),
    (dict(Dense_0={"kernel": np.zeros((24, 128), np.int32)}), "floating \\(K, N\\) matrix"),
    (dict(Dense_0={"kernel": np.zeros((24, 128), np.float32), "bias": np.zeros(7, np.float32)}), "bias must"),
    (dict(Dense_1={"kernel": np.zeros((100, 128), np.float32)}), "Layer 0 outputs 128 features but layer 1"),
])
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
    with pytest.raises(ValueError, match="tuple"):
        Int8MLP.from_quantized([(codes, scales)])
    with pytest.raises(ValueError, match="Layer 0 outputs"):
        Int8MLP.from_quantized([runtime.layers[0], runtime.layers[0]])
    with pytest.raises(ValueError, match="output_activation"):
        Int8MLP.from_params(params, "relu")
    with pytest.raises(ValueError, match="reduce_range"):
        Int8MLP.from_params(params, reduce_range=1)
    with pytest.raises(ValueError, match="threads"):
        Int8MLP.from_params(params, threads=0)
    with pytest.raises(ValueError, match=r"obs must have shape \(24,\) or \(B, 24\)"):
        runtime(np.zeros((2, 23), np.float32))
    with pytest.raises(ValueError, match="obs must have shape"):
        runtime(np.zeros((1, 2, 24), np.float32))
    with pytest.raises(ValueError, match="finite"):
        runtime(np.full((24,), np.nan, np.float32))
    layers = [(codes, scales, None)]  # a bias may be absent
    assert Int8MLP.from_quantized(layers, "none")(np.ones(OBS)).shape == (HIDDEN[0],)


# ------------------------------------------------------------------------------- process-global state, imports


def test_threads_is_process_global(params):
    torch.set_num_threads(2)
    Int8MLP.from_params(params, threads=None)
    assert torch.get_num_threads() == 2
    Int8MLP.from_params(params)
    assert torch.get_num_threads() == 1


def test_packs_with_fbgemm_and_restores_the_engine(params, runtime):
    previous = torch.backends.quantized.engine
    torch.backends.quantized.engine = "onednn"
    try:
        rt = Int8MLP.from_params(params, "none", reduce_range=False)
        assert torch.backends.quantized.engine == "onednn"
        x = obs_batches(1, count=1)[0]
        np.testing.assert_array_equal(rt(x), runtime(x))
    finally:
        torch.backends.quantized.engine = previous


def test_saturation_probe_picks_reduce_range(params):
    saturates = inference.fbgemm_saturates()
    assert isinstance(saturates, bool)
    assert Int8MLP.from_params(params).reduce_range == saturates


def test_imports_neither_torch_nor_lpjax_beyond_quant():
    code = "import sys, lpjax.inference; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    package = pathlib.Path(inference.__file__).parent
    for file in package.rglob("*.py"):
        for node in ast.walk(ast.parse(file.read_text())):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else (
                [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            for name in names:
                if name.startswith("lpjax"):
                    assert name.startswith(("lpjax.quant", "lpjax.inference")), f"{file.name} imports {name}"
