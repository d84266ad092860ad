"""round_to_nearest: the cast's rounding, subnormals included, that XLA keeps."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpjax.optim._rounding import round_to_nearest


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_matches_the_cast_on_random_values_of_every_magnitude(dtype):
    rng = np.random.default_rng(0)
    x = (rng.choice([-1, 1], 200_000) * 2.0 ** rng.uniform(-26, 15.9, 200_000)).astype(np.float32)
    got = np.asarray(jax.jit(lambda v: round_to_nearest(v, dtype))(jnp.asarray(x)))
    np.testing.assert_array_equal(got, x.astype(dtype).astype(np.float32))


def test_every_float16_value_including_subnormals_is_kept():
    """lax.reduce_precision alone flushes float16's subnormals (below 2^-14) to zero."""
    values = np.arange(2**16, dtype=np.uint16).view(np.float16).astype(np.float32)
    values = values[np.isfinite(values)]
    got = np.asarray(jax.jit(lambda v: round_to_nearest(v, jnp.float16))(jnp.asarray(values)))
    np.testing.assert_array_equal(got, values)
    subnormal = jnp.asarray([3e-6, -5.9604645e-08], jnp.float32)
    assert np.all(np.asarray(jax.lax.reduce_precision(subnormal, exponent_bits=5, mantissa_bits=10)) == 0)
    assert np.all(np.asarray(round_to_nearest(subnormal, jnp.float16)) != 0)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_matches_the_cast_on_every_kind_of_float32(dtype):
    # Uniform over float32's bit patterns (its subnormals, huge values, inf and nan), with both zeros and the
    # target's own smallest values: the rounding never turns a zero or a tiny value into nan.
    finfo = jnp.finfo(dtype)
    bits = np.random.default_rng(1).integers(0, 2**32, size=100_000, dtype=np.uint64).astype(np.uint32)
    special = [0.0, -0.0, float(finfo.smallest_subnormal), -float(finfo.smallest_normal), float(finfo.max), np.inf]
    x = np.concatenate([bits.view(np.float32), np.asarray(special, np.float32)])
    for fn in (jax.jit(lambda v: round_to_nearest(v, dtype)), lambda v: round_to_nearest(v, dtype)):
        got = np.asarray(fn(jnp.asarray(x)))
        np.testing.assert_array_equal(got, x.astype(dtype).astype(np.float32))
