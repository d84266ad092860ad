"""Blockwise FP8 (E4M3) quantizers of lpjax.quant.fp8.

Round-trip bound asserted, element-wise, with ``s`` the scale of the element's tile: e4m3 keeps 3 explicit
mantissa bits, so rounding ``q = w / s`` to the nearest e4m3 is off by at most half a unit in the last place:
``2^-4 |q|`` for normal codes (``|q| >= 2^-6``) and ``2^-10`` (half the subnormal spacing ``2^-9``) below. Hence
``|w - deq(w)| <= max(2^-4 |w|, 2^-10 s)``, which implies the coarser ``<= 2^-4 amax(tile) = 2^-4 * 448 s``.
A relative slack of ``2^-20`` covers the float32 rounding of ``w / s`` and ``q * s``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from lpjax import quant
from lpjax.quant import E4M3_MAX, Fp8BlockwiseWeight

SLACK = 1.0 + 2.0**-20


def _blocky(seed, shape, block=128):
    """Gaussian values whose magnitude varies by up to 2^+-8 between tiles (so per-tile scales matter)."""
    rng = np.random.default_rng(seed)
    tiles = (-(-shape[0] // block), -(-shape[1] // block))
    mag = 2.0 ** rng.integers(-8, 9, tiles)
    mag = np.repeat(np.repeat(mag, block, 0), block, 1)[: shape[0], : shape[1]]
    return jnp.asarray(rng.standard_normal(shape) * mag, jnp.float32)


def _expand(scales, shape, rows, cols):
    return np.repeat(np.repeat(np.asarray(scales), rows, 0), cols, 1)[: shape[0], : shape[1]]


def _numpy_quantize(x, rows, cols):
    """Independent NumPy version: float32 amax * f32(1/448) per tile, times f32(1/s), clip, ml_dtypes cast."""
    x = np.asarray(x, np.float32)
    r, c = x.shape
    rb, cb = -(-r // rows), -(-c // cols)
    scales = np.ones((rb, cb), np.float32)
    for i in range(rb):
        for j in range(cb):
            amax = np.abs(x[i * rows : (i + 1) * rows, j * cols : (j + 1) * cols]).max()
            if amax > 0:
                scales[i, j] = amax * np.float32(1.0 / 448.0)
    q = np.clip(x * (np.float32(1.0) / _expand(scales, x.shape, rows, cols)), -448, 448).astype(ml_dtypes.float8_e4m3fn)
    return q, scales


def _assert_roundtrip_bound(x, deq, s_full):
    x, deq = np.asarray(x, np.float64), np.asarray(deq, np.float64)
    err = np.abs(x - deq)
    bound = np.maximum(2.0**-4 * np.abs(x), 2.0**-10 * s_full) * SLACK
    assert np.all(err <= bound), float(np.max(err / bound))
    assert np.all(err <= 2.0**-4 * E4M3_MAX * s_full * SLACK)
    return float(np.max(err / (E4M3_MAX * s_full)))


SHAPES = [(128, 128), (200, 130), (1, 1), (300, 257), (129, 1)]


@pytest.mark.parametrize("shape", SHAPES)
def test_blockwise_round_trip_bound_and_numpy_agreement(shape):
    w = _blocky(shape[0] * 1000 + shape[1], shape)
    qw = quant.quantize_fp8_blockwise(w)
    assert qw.codes.shape == shape and qw.codes.dtype == jnp.float8_e4m3fn
    assert qw.scales.shape == (-(-shape[0] // 128), -(-shape[1] // 128)) and qw.scales.dtype == jnp.float32
    assert qw.shape == shape
    deq = quant.dequantize_fp8_blockwise(qw)
    assert deq.shape == shape and deq.dtype == jnp.float32
    worst = _assert_roundtrip_bound(w, deq, _expand(qw.scales, shape, 128, 128))
    assert worst <= 2.0**-4
    # Same codes and scales, bit for bit, as an independent NumPy / ml_dtypes implementation.
    q_np, s_np = _numpy_quantize(w, 128, 128)
    np.testing.assert_array_equal(np.asarray(qw.scales), s_np)
    np.testing.assert_array_equal(np.asarray(qw.codes).view(np.uint8), q_np.view(np.uint8))
    # Each tile's largest magnitude lands on +-448 exactly.
    amax_codes = np.abs(np.asarray(qw.codes, np.float32))
    for i in range(qw.scales.shape[0]):
        for j in range(qw.scales.shape[1]):
            assert amax_codes[i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128].max() == E4M3_MAX


def test_blockwise_other_block_size():
    w = _blocky(1, (70, 50), block=32)
    qw = quant.quantize_fp8_blockwise(w, block=32)
    assert qw.scales.shape == (3, 2)
    deq = quant.dequantize_fp8_blockwise(qw, block=32)
    _assert_roundtrip_bound(w, deq, _expand(qw.scales, w.shape, 32, 32))


def test_zero_tiles_give_unit_scale_zero_codes_and_no_nan():
    w = _blocky(2, (200, 300))
    w = w.at[:128, 128:256].set(0.0).at[128:, 256:].set(0.0)  # a full and a ragged zero tile
    qw = quant.quantize_fp8_blockwise(w)
    assert float(qw.scales[0, 1]) == 1.0 and float(qw.scales[1, 2]) == 1.0
    assert np.all(np.asarray(qw.codes[:128, 128:256], np.float32) == 0)
    deq = quant.dequantize_fp8_blockwise(qw)
    assert np.all(np.isfinite(deq)) and np.all(np.asarray(deq[128:, 256:]) == 0)
    zeros = quant.quantize_fp8_blockwise(jnp.zeros((5, 7)))
    assert np.all(np.isfinite(np.asarray(zeros.codes, np.float32))) and np.all(zeros.scales == 1.0)
    assert np.all(quant.dequantize_fp8_blockwise(zeros) == 0)


def test_large_values_are_clipped_not_nan():
    # A plain cast maps 464 and above to NaN (e4m3fn has no infinity): the reason for clipping first.
    assert np.isnan(np.asarray(jnp.asarray([470.0]).astype(jnp.float8_e4m3fn), np.float32)).all()
    w = jnp.asarray([[3e38, -1e30, 470.0, 1.0], [500.0, -464.0, 0.0, 2e-30]], jnp.float32)
    for qw in (quant.quantize_fp8_blockwise(w), Fp8BlockwiseWeight(*quant.quantize_fp8_per_token_group(w))):
        codes = np.asarray(qw.codes, np.float32)
        assert np.all(np.isfinite(codes)) and np.all(np.abs(codes) <= E4M3_MAX)
    deq = quant.dequantize_fp8_blockwise(quant.quantize_fp8_blockwise(w))
    assert np.isfinite(deq).all() and float(deq[0, 0]) == pytest.approx(3e38, rel=1e-6)
    f16 = jnp.asarray([[65504.0, -65504.0, 1.0]], jnp.float16)
    assert np.isfinite(quant.dequantize_fp8_blockwise(quant.quantize_fp8_blockwise(f16))).all()


def test_tiny_scales_are_never_zero():
    w = jnp.asarray([[1e-42, 0.0], [-1e-40, 3e-39]], jnp.float32)  # amax / 448 is subnormal (or underflows)
    qw = quant.quantize_fp8_blockwise(w)
    assert float(qw.scales[0, 0]) >= np.finfo(np.float32).tiny
    assert np.isfinite(np.asarray(qw.codes, np.float32)).all()
    assert np.all(np.abs(quant.dequantize_fp8_blockwise(qw) - w) <= 1e-38)


@pytest.mark.parametrize("shape", [(1, 128), (3, 200), (70, 129), (4, 1)])
def test_per_token_group_round_trip_bound_and_numpy_agreement(shape):
    x = np.random.default_rng(shape[1]).standard_normal(shape) * np.logspace(-3, 3, shape[0])[:, None]
    x[0, :128] = 0.0  # an all-zero group
    x = jnp.asarray(x, jnp.float32)
    codes, scales = quant.quantize_fp8_per_token_group(x)
    assert codes.shape == shape and codes.dtype == jnp.float8_e4m3fn
    assert scales.shape == (shape[0], -(-shape[1] // 128)) and scales.dtype == jnp.float32
    assert float(scales[0, 0]) == 1.0
    deq = quant.dequantize_fp8_per_token_group(codes, scales)
    assert np.isfinite(deq).all() and np.all(np.asarray(deq[0, : min(shape[1], 128)]) == 0)
    _assert_roundtrip_bound(x, deq, _expand(scales, shape, 1, 128))
    q_np, s_np = _numpy_quantize(x, 1, 128)
    np.testing.assert_array_equal(np.asarray(scales), s_np)
    np.testing.assert_array_equal(np.asarray(codes).view(np.uint8), q_np.view(np.uint8))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_low_precision_inputs_quantize_like_their_float32_values(dtype):
    w = jnp.asarray(np.random.default_rng(3).standard_normal((130, 140)), dtype)
    a, b = quant.quantize_fp8_blockwise(w), quant.quantize_fp8_blockwise(w.astype(jnp.float32))
    np.testing.assert_array_equal(np.asarray(a.codes).view(np.uint8), np.asarray(b.codes).view(np.uint8))
    np.testing.assert_array_equal(a.scales, b.scales)


def test_jit_equals_eager():
    w = _blocky(4, (200, 130))
    for fn in (quant.quantize_fp8_blockwise, quant.quantize_fp8_per_token_group):
        with jax.disable_jit():  # op by op
            eager = fn(w)
        for e, j in zip(eager, jax.jit(fn)(w)):
            np.testing.assert_array_equal(np.asarray(e, np.float32), np.asarray(j, np.float32))
    qw = quant.quantize_fp8_blockwise(w)
    with jax.disable_jit():
        eager = quant.dequantize_fp8_blockwise(qw)
    np.testing.assert_array_equal(eager, jax.jit(quant.dequantize_fp8_blockwise)(qw))
    # The NamedTuple is a pytree: it crosses jit boundaries.
    out = jax.jit(lambda q: q)(qw)
    assert isinstance(out, Fp8BlockwiseWeight)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="matrix"):
        quant.quantize_fp8_blockwise(jnp.ones((4,)))
    with pytest.raises(ValueError, match="matrix"):
        quant.quantize_fp8_per_token_group(jnp.ones((2, 3, 4)))
    with pytest.raises(ValueError, match="floating"):
        quant.quantize_fp8_blockwise(jnp.ones((4, 4), jnp.int32))
    with pytest.raises(ValueError, match="floating"):
        quant.quantize_fp8_per_token_group(jnp.ones((4, 4), jnp.int8))
    for bad in (100, 0, -128, 1.5, True):
        with pytest.raises(ValueError, match="power of two"):
            quant.quantize_fp8_blockwise(jnp.ones((4, 4)), block=bad)
    with pytest.raises(ValueError, match="power of two"):
        quant.quantize_fp8_per_token_group(jnp.ones((4, 4)), group=96)
    qw = quant.quantize_fp8_blockwise(jnp.ones((200, 4)))
    with pytest.raises(ValueError, match="scales"):
        quant.dequantize_fp8_blockwise(qw, block=64)
    with pytest.raises(ValueError, match="scales"):
        quant.dequantize_fp8_per_token_group(qw.codes, jnp.ones((200, 2)))
