"""The QuaRL/ActorQ uniform PTQ of lpjax.quant.uniform, against a float64 NumPy implementation of the formula.

Reference: ``delta = (|min(W, 0)| + |max(W, 0)|) / 2^n`` and ``round(W / delta)`` evaluated in float64 on the
float32 inputs. lpjax computes in float32 (``W * f32(1 / delta)``), so codes may differ by one where ``W / delta``
is within float32 rounding of a half-integer; everywhere else they must be equal. The round-trip bound
``|W - delta * Q(W)| <= delta / 2`` is asserted element-wise up to float32 rounding: ``2^-20`` relative slack
plus ``2^-23 |W|`` for the rounding of the product ``delta * Wq`` (which matters from ~12 bits on).
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpjax import quant
from lpjax.quant import HalfPrecision, QuantSpec, UniformQuantized

SLACK = 1.0 + 2.0**-20
ULP = 2.0**-23  # float32 rounding of the dequantized product delta * Wq (up to 2^n delta, so 2^(n-23) delta)
BITS = [2, 3, 4, 5, 6, 7, 8, 12, 14, 15, 16]


def _data(seed, shape, shift=0.0):
    """Gaussian values with column magnitudes spread over 10^+-2, optionally shifted (asymmetric ranges)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) + shift
    x = x * rng.permutation(np.logspace(-2, 2, shape[-1]))
    return np.asarray(x, np.float32)


def _reference(x, bits, reduce_axes):
    """The papers' formula in float64."""
    x = np.asarray(x, np.float64)
    span = np.abs(np.minimum(x, 0).min(axis=reduce_axes, keepdims=True)) + np.abs(
        np.maximum(x, 0).max(axis=reduce_axes, keepdims=True)
    )
    delta = span / 2.0**bits
    ratio = x / np.where(delta > 0, delta, 1.0)
    return np.round(ratio), delta, ratio


def _check(x, bits, axis, reduce_axes):
    codes, delta = quant.uniform_quantize(jnp.asarray(x), bits, axis)
    assert codes.shape == x.shape and codes.dtype == quant.code_dtype(bits) and delta.dtype == jnp.float32
    ref_codes, ref_delta, ratio = _reference(x, bits, reduce_axes)
    delta_np = np.asarray(delta, np.float64)
    assert delta_np.shape == (() if axis is None else ref_delta.shape)
    np.testing.assert_allclose(np.broadcast_to(delta_np, ref_delta.shape), ref_delta, rtol=2.0**-23, atol=0)
    codes_np = np.asarray(codes, np.int64)
    near_tie = np.abs(np.abs(ratio - np.floor(ratio)) - 0.5) < 1e-5 * np.maximum(1.0, np.abs(ratio))
    np.testing.assert_array_equal(codes_np[~near_tie], ref_codes[~near_tie])
    assert np.all(np.abs(codes_np - ref_codes) <= 1)
    assert np.all(np.abs(codes_np) <= 2**bits)
    # |W - D(Q(W))| <= delta / 2, element-wise.
    err = np.abs(x.astype(np.float64) - np.asarray(quant.uniform_dequantize(codes, delta), np.float64))
    half = 0.5 * np.broadcast_to(delta_np, x.shape)
    assert np.all(err <= half * SLACK + ULP * np.abs(x)), float(np.max(err / half))
    return codes, delta


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("shift", [0.0, 1.5])
def test_per_tensor_matches_the_float64_formula(bits, shift):
    x = _data(bits, (37, 53), shift)
    _check(x, bits, None, (0, 1))


@pytest.mark.parametrize("bits", BITS)
def test_per_channel_matches_the_float64_formula(bits):
    x = _data(100 + bits, (64, 24), shift=-0.7)
    _, delta = _check(x, bits, -1, (0,))
    assert delta.shape == (1, 24)
    # Per output channel: every column's range is resolved on its own, so small columns keep their precision.
    _check(x, bits, 1, (0,))
    _check(x, bits, 0, (1,))
    _check(_data(bits, (3, 4, 5, 6)), bits, (0, 3), (1, 2))


@pytest.mark.parametrize("bits", [2, 4, 6, 7, 8, 14, 15, 16])
def test_codes_span_minus_to_plus_two_to_the_n_and_fit_their_dtype(bits):
    positive = np.abs(_data(bits, (50, 7))) + np.float32(0.01)
    codes, _ = quant.uniform_quantize(jnp.asarray(positive), bits)
    assert int(np.max(np.asarray(codes, np.int64))) == 2**bits  # the maximum maps to exactly 2^n
    codes, _ = quant.uniform_quantize(jnp.asarray(-positive), bits)
    assert int(np.min(np.asarray(codes, np.int64))) == -(2**bits)
    symmetric = np.array([-3.0, -1.0, 0.0, 2.0, 3.0], np.float32)
    codes, delta = quant.uniform_quantize(jnp.asarray(symmetric), bits)
    assert float(delta) == 6.0 / 2**bits and int(codes[-1]) == 2 ** (bits - 1)
    info = np.iinfo(quant.code_dtype(bits))
    assert info.min <= -(2**bits) and 2**bits <= info.max


def test_code_dtype_is_the_smallest_that_holds_the_codes():
    expected = {
        **dict.fromkeys(range(2, 7), np.int8),
        **dict.fromkeys(range(7, 15), np.int16),
        15: np.int32,
        16: np.int32,
    }
    for bits, dtype in expected.items():
        assert quant.code_dtype(bits) == dtype, bits
    # int8 is NOT enough for 8 bits: an all-positive weight's maximum has code 256.
    assert np.iinfo(np.int8).max < 2**8


def test_error_shrinks_to_identity_as_bits_grow():
    x = _data(7, (128, 96), shift=0.3)
    span = float(np.abs(np.minimum(x, 0).min()) + np.maximum(x, 0).max())
    errors = []
    for bits in range(2, 17):
        deq = np.asarray(quant.uniform_dequantize(*quant.uniform_quantize(jnp.asarray(x), bits)))
        errors.append(float(np.max(np.abs(deq - x))))
        assert errors[-1] <= span / 2 ** (bits + 1) * SLACK + ULP * float(np.max(np.abs(x)))
    assert all(a > b for a, b in itertools.pairwise(errors))
    assert errors[-1] / span < 2.0**-16
    # Values on the grid are reproduced exactly.
    grid = np.arange(-4, 5, dtype=np.float32) * np.float32(0.25)
    codes, delta = quant.uniform_quantize(jnp.asarray(grid), 4)
    np.testing.assert_array_equal(np.asarray(quant.uniform_dequantize(codes, delta)), grid)


def test_zero_tensors_and_zero_channels_give_zero_delta_without_nan():
    codes, delta = quant.uniform_quantize(jnp.zeros((4, 3)), 8)
    assert float(delta) == 0.0 and not np.any(np.asarray(codes))
    np.testing.assert_array_equal(np.asarray(quant.uniform_dequantize(codes, delta)), np.zeros((4, 3)))
    x = np.array([[0.0, 1.0, -2.0], [0.0, 3.0, 0.5]], np.float32)
    codes, delta = quant.uniform_quantize(jnp.asarray(x), 4, axis=-1)
    np.testing.assert_array_equal(np.asarray(delta), [[0.0, 3.0 / 16, 2.5 / 16]])
    deq = np.asarray(quant.uniform_dequantize(codes, delta))
    assert np.all(np.isfinite(deq)) and np.all(deq[:, 0] == 0.0)
    # Ranges so small that delta would be subnormal: delta is raised to the smallest normal, still finite.
    # (Normal inputs: XLA:CPU flushes subnormal ones to zero.)
    tiny = jnp.asarray([2e-38, -5e-38, 0.0], jnp.float32)
    codes, delta = quant.uniform_quantize(tiny, 16)
    assert float(delta) == np.finfo(np.float32).tiny
    deq = np.asarray(quant.uniform_dequantize(codes, delta))
    assert np.all(np.isfinite(deq)) and np.all(np.abs(deq - np.asarray(tiny)) <= float(delta) / 2)


def test_jit_matches_eager_and_low_precision_inputs_are_accepted():
    x = jnp.asarray(_data(3, (16, 8), 0.5))
    quantize = jax.jit(quant.uniform_quantize, static_argnums=(1, 2))
    for bits, axis in ((4, None), (8, -1)):
        for a, b in zip(quantize(x, bits, axis), quant.uniform_quantize(x, bits, axis)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    codes, delta = quant.uniform_quantize(x.astype(jnp.bfloat16), 6)
    assert codes.dtype == jnp.int8 and delta.dtype == jnp.float32


@pytest.mark.parametrize("bits", [0, 1, 17, 32, 8.0, True, "8", None])
def test_bad_bits_raise(bits):
    with pytest.raises(ValueError, match=r"bits must be an integer in \[2, 16\]"):
        quant.uniform_quantize(jnp.ones(3), bits)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="floating dtype"):
        quant.uniform_quantize(jnp.arange(4), 8)
    with pytest.raises(ValueError, match="out of range"):
        quant.uniform_quantize(jnp.ones((2, 3)), 8, axis=2)
    with pytest.raises(ValueError, match="integer dtype"):
        quant.uniform_dequantize(jnp.ones(3), 1.0)


# ------------------------------------------------------------------------------------------ parameter trees


def _params(dtype=jnp.float32):
    return {
        "params": {
            "Dense_0": {
                "kernel": jnp.asarray(_data(1, (6, 16), 0.2), dtype),
                "bias": jnp.asarray(_data(2, (16,)), dtype),
            },
            "Dense_1": {"kernel": jnp.asarray(_data(3, (16, 4)), dtype), "bias": jnp.zeros(4, dtype)},
            "Conv_0": {"kernel": jnp.asarray(_data(4, (3, 3, 2, 5)), dtype)},
            "count": jnp.asarray(3, jnp.int32),
        }
    }


def _structure_and_dtypes(tree):
    return jax.tree.structure(tree), [(x.shape, x.dtype) for x in jax.tree.leaves(tree)]


def test_fp32_spec_is_the_identity():
    params = _params()
    assert quant.quantize_params(params, "fp32") is not None
    for a, b in zip(jax.tree.leaves(quant.quantize_params(params, "fp32")), jax.tree.leaves(params)):
        assert a is b


def test_fp16_spec_rounds_weights_and_keeps_biases():
    params = _params()
    qparams = quant.quantize_params(params, "fp16")
    kernel = qparams["params"]["Dense_0"]["kernel"]
    assert isinstance(kernel, HalfPrecision) and kernel.values.dtype == jnp.float16
    assert qparams["params"]["Dense_0"]["bias"] is params["params"]["Dense_0"]["bias"]
    restored = quant.dequantize_params(qparams)
    assert _structure_and_dtypes(restored) == _structure_and_dtypes(params)
    expected = np.asarray(params["params"]["Dense_0"]["kernel"]).astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(restored["params"]["Dense_0"]["kernel"]), expected)
    everything = quant.dequantize_params(quant.quantize_params(params, {"format": "fp16", "vectors": True}))
    bias = np.asarray(params["params"]["Dense_0"]["bias"])
    np.testing.assert_array_equal(
        np.asarray(everything["params"]["Dense_0"]["bias"]), bias.astype(np.float16).astype(np.float32)
    )


@pytest.mark.parametrize(
    "spec, per_channel",
    [("int4", False), ("int8_per_channel", True), ({"bits": 6, "per_channel": True}, True), ({"bits": 3}, False)],
)
def test_int_specs_quantize_weights_per_tensor_or_per_output_channel(spec, per_channel):
    params = _params()
    qparams = quant.quantize_params(params, spec)
    bits = quant.parse_spec(spec).bits
    for name in ("Dense_0", "Dense_1", "Conv_0"):
        q = qparams["params"][name]["kernel"]
        w = np.asarray(params["params"][name]["kernel"])
        assert isinstance(q, UniformQuantized) and q.bits == bits and q.dtype == "float32" and q.shape == w.shape
        assert q.delta.shape == ((1,) * (w.ndim - 1) + (w.shape[-1],) if per_channel else ())
        codes, delta = quant.uniform_quantize(jnp.asarray(w), bits, -1 if per_channel else None)
        np.testing.assert_array_equal(np.asarray(q.codes), np.asarray(codes))
        np.testing.assert_array_equal(np.asarray(q.delta), np.asarray(delta))
    assert qparams["params"]["Dense_0"]["bias"] is params["params"]["Dense_0"]["bias"]
    assert qparams["params"]["count"] is params["params"]["count"]
    restored = jax.jit(quant.dequantize_params)(qparams)  # UniformQuantized is a pytree: crosses jit
    assert _structure_and_dtypes(restored) == _structure_and_dtypes(params)
    for name in ("Dense_0", "Dense_1", "Conv_0"):
        q = qparams["params"][name]["kernel"]
        w = np.asarray(params["params"][name]["kernel"])
        err = np.abs(np.asarray(restored["params"][name]["kernel"]) - w)
        assert np.all(err <= 0.5 * np.asarray(q.delta) * SLACK + ULP * np.abs(w))


def test_vectors_option_quantizes_biases_per_tensor_and_dtypes_survive():
    params = _params(jnp.bfloat16)
    qparams = quant.quantize_params(params, {"bits": 8, "per_channel": True, "vectors": True})
    bias = qparams["params"]["Dense_0"]["bias"]
    assert isinstance(bias, UniformQuantized) and bias.delta.shape == () and bias.dtype == "bfloat16"
    assert isinstance(qparams["params"]["Dense_1"]["bias"], UniformQuantized)  # zeros: delta 0
    restored = quant.dequantize_params(qparams)
    assert _structure_and_dtypes(restored) == _structure_and_dtypes(params)
    assert not np.any(np.asarray(restored["params"]["Dense_1"]["bias"], np.float32))


def test_per_channel_is_never_worse_than_per_tensor():
    params = _params()
    for bits in (2, 4, 8):
        worst = {}
        for spec in (f"int{bits}", f"int{bits}_per_channel"):
            restored = quant.dequantize_params(quant.quantize_params(params, spec))
            worst[spec] = max(
                float(
                    np.max(
                        np.abs(np.asarray(restored["params"][n]["kernel"]) - np.asarray(params["params"][n]["kernel"]))
                    )
                )
                for n in ("Dense_0", "Dense_1", "Conv_0")
            )
        assert worst[f"int{bits}_per_channel"] <= worst[f"int{bits}"]


def test_parse_spec_forms_and_names():
    assert quant.parse_spec("INT8") == QuantSpec("int", 8, False, False)
    assert quant.parse_spec("int4_per_channel") == QuantSpec("int", 4, True, False)
    assert quant.parse_spec({"bits": 5, "per_channel": True}).name == "int5_per_channel"
    assert quant.parse_spec({"format": "fp16", "vectors": True}).name == "fp16+vectors"
    assert quant.parse_spec(QuantSpec("int", 2)) == QuantSpec("int", 2)
    assert quant.parse_spec("fp32").name == "fp32"


@pytest.mark.parametrize(
    "spec, error, message",
    [
        ("int1", ValueError, "bits"),
        ("int17", ValueError, "bits"),
        ("fp8", ValueError, "valid: 'fp32', 'fp16'"),
        ("int8_per_row", ValueError, "Unknown quantization spec"),
        ({"bits": 8, "axis": 0}, ValueError, "axis"),
        ({"format": "fp16", "bits": 8}, ValueError, "only apply to format 'int'"),
        ({}, ValueError, "needs format"),
        ({"bits": 4, "per_channel": "yes"}, TypeError, "must be a bool"),
        (8, TypeError, "str or dict"),
    ],
)
def test_bad_specs_raise_with_the_valid_forms(spec, error, message):
    with pytest.raises(error, match=message):
        quant.quantize_params(_params(), spec)


def test_non_array_leaves_raise_naming_the_path():
    with pytest.raises(TypeError, match=r"\['layer'\]\['name'\].*str"):
        quant.quantize_params({"layer": {"name": "dense", "kernel": jnp.ones((2, 2))}}, "int8")
