"""Symmetric int8 quantizers of lpjax.quant.int8.

Round-trip bound asserted, element-wise: ``round`` is off by at most 1/2, so ``|x - q s| <= s / 2`` with ``s``
the scale of the element's slice (``amax / 127``); a relative slack of ``2^-20`` covers float32 rounding.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpjax import quant
from lpjax.quant import INT8_MAX, Int8Weight

SLACK = 1.0 + 2.0**-20


def _data(seed, shape, spread=3.0):
    """Gaussian values with row and column magnitudes spread over 10^+-spread."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    for axis, size in enumerate(shape):
        mag = np.logspace(-spread, spread, size)
        x = x * rng.permutation(mag).reshape([size if a == axis else 1 for a in range(len(shape))])
    return jnp.asarray(x, jnp.float32)


def _numpy_quantize(x, reduce_axes):
    """Independent NumPy version: amax * f32(1/127), round half to even of x * f32(1/s), clip."""
    x = np.asarray(x, np.float32)
    amax = np.abs(x).max(axis=reduce_axes, keepdims=True)
    s = np.where(amax > 0, amax * np.float32(1.0 / 127.0), np.float32(1.0)).astype(np.float32)
    return np.clip(np.rint(x * (np.float32(1.0) / s)), -127, 127).astype(np.int8), s


def _check(x, codes, scale, reduce_axes):
    assert codes.dtype == jnp.int8 and codes.shape == x.shape and scale.dtype == jnp.float32
    codes_np = np.asarray(codes, np.int64)
    assert np.all(np.abs(codes_np) <= 127)
    err = np.abs(np.asarray(x, np.float64) - np.asarray(quant.dequantize_int8(codes, scale), np.float64))
    half = 0.5 * np.broadcast_to(np.asarray(scale, np.float64), x.shape)
    assert np.all(err <= half * SLACK), float(np.max(err / half))
    # Every slice's largest magnitude maps to +-127; codes equal the NumPy implementation's bit for bit.
    assert np.all(np.abs(codes_np).max(axis=reduce_axes) == 127)
    q_np, s_np = _numpy_quantize(x, reduce_axes)
    np.testing.assert_array_equal(np.asarray(codes), q_np)
    np.testing.assert_array_equal(np.asarray(scale).reshape(s_np.shape), s_np)
    return float(np.max(err / half))


@pytest.mark.parametrize("shape", [(1, 1), (3, 200), (70, 129), (256, 384)])
def test_per_tensor_and_per_channel_round_trip(shape):
    x = _data(shape[0] + shape[1], shape)
    codes, scale = quant.quantize_int8(x)
    assert scale.shape == ()
    _check(x, codes, scale, (0, 1))
    for axis, scale_shape, reduce_axes in (
        (0, (shape[0], 1), (1,)),
        (1, (1, shape[1]), (0,)),
        (-1, (1, shape[1]), (0,)),
    ):
        codes, scale = quant.quantize_int8(x, axis=axis)
        assert scale.shape == scale_shape
        _check(x, codes, scale, reduce_axes)


def test_weight_and_per_token_helpers():
    w = _data(1, (200, 130))
    qw = quant.quantize_int8_weight(w)
    assert isinstance(qw, Int8Weight) and qw.shape == (200, 130) and qw.scales.shape == (130,)
    _check(w, qw.codes, qw.scales, (0,))
    codes, scales = quant.quantize_int8_per_token(w)
    assert scales.shape == (200, 1)
    _check(w, codes, scales, (1,))


def test_axis_tuple_on_3d():
    x = _data(2, (4, 5, 6))
    codes, scale = quant.quantize_int8(x, axis=(0, 2))
    assert scale.shape == (4, 1, 6)
    _check(x, codes, scale, (1,))


def test_per_channel_beats_per_tensor_on_uneven_channels():
    rng = np.random.default_rng(3)
    w = jnp.asarray(rng.standard_normal((256, 64)) * np.logspace(-3, 3, 64), jnp.float32)  # column magnitudes
    col_norm = jnp.abs(w).mean(axis=0)

    def mean_relative_column_error(codes, scale):
        return float((jnp.abs(quant.dequantize_int8(codes, scale) - w).mean(axis=0) / col_norm).mean())

    per_tensor = mean_relative_column_error(*quant.quantize_int8(w))
    per_channel = mean_relative_column_error(*quant.quantize_int8(w, axis=1))
    assert per_channel < 0.01 and per_tensor > 0.5  # small columns round to zero with one scale


def test_zero_slices_and_zero_tensor_are_safe():
    x = _data(4, (5, 7)).at[2].set(0.0)
    codes, scale = quant.quantize_int8_per_token(x)
    assert float(scale[2, 0]) == 1.0 and np.all(np.asarray(codes[2]) == 0)
    assert np.isfinite(quant.dequantize_int8(codes, scale)).all()
    codes, scale = quant.quantize_int8(jnp.zeros((3, 3)))
    assert float(scale) == 1.0 and np.all(np.asarray(codes) == 0)
    tiny = jnp.asarray([[1e-42, -1e-40]], jnp.float32)  # amax / 127 is subnormal
    codes, scale = quant.quantize_int8(tiny)
    assert float(scale) >= np.finfo(np.float32).tiny and np.isfinite(quant.dequantize_int8(codes, scale)).all()


def test_extreme_values_stay_finite():
    x = jnp.asarray([[3e38, -3e38, 1.0], [65504.0, 0.0, -1e-30]], jnp.float32)
    codes, scale = quant.quantize_int8(x)
    deq = quant.dequantize_int8(codes, scale)
    assert np.isfinite(deq).all() and float(deq[0, 0]) == pytest.approx(3e38, rel=1e-6)
    codes, scale = quant.quantize_int8(jnp.asarray([[65504.0, -1.0]], jnp.float16), axis=0)
    assert np.asarray(codes).tolist() == [[127, 0]]


def test_low_precision_inputs_quantize_like_their_float32_values():
    w = _data(5, (64, 32))
    for dtype in (jnp.bfloat16, jnp.float16):
        low = w.astype(dtype)
        a, b = quant.quantize_int8(low, axis=1), quant.quantize_int8(low.astype(jnp.float32), axis=1)
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])


def test_jit_equals_eager():
    x = _data(6, (70, 129))
    for fn in (
        quant.quantize_int8,
        lambda v: quant.quantize_int8(v, axis=1),
        quant.quantize_int8_per_token,
        lambda v: tuple(quant.quantize_int8_weight(v)),
    ):
        with jax.disable_jit():  # op by op
            eager = fn(x)
        for e, j in zip(eager, jax.jit(fn)(x)):
            np.testing.assert_array_equal(e, j)
    out = jax.jit(lambda q: q)(quant.quantize_int8_weight(x))
    assert isinstance(out, Int8Weight)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="floating"):
        quant.quantize_int8(jnp.ones((3, 3), jnp.int32))
    with pytest.raises(ValueError, match="out of range"):
        quant.quantize_int8(jnp.ones((3, 3)), axis=2)
    with pytest.raises(ValueError, match="out of range"):
        quant.quantize_int8(jnp.ones((3, 3)), axis=(0, -3))
    with pytest.raises(ValueError, match="2 dimensions"):
        quant.quantize_int8_weight(jnp.ones((3,)))
    with pytest.raises(ValueError, match="2 dimensions"):
        quant.quantize_int8_per_token(jnp.ones((2, 3, 4)))
    with pytest.raises(ValueError, match="int8"):
        quant.dequantize_int8(jnp.ones((3, 3), jnp.int32), 1.0)
    assert INT8_MAX == 127.0
