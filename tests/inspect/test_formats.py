"""NumberFormat's thresholds agree with what casting to each dtype actually does."""

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from lpjax.inspect import number_format
from lpjax.inspect.formats import is_narrow

FORMATS = ["float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"]


def _cast(values: np.ndarray, dtype: str) -> np.ndarray:
    """Round-to-nearest-even of float64 values into ``dtype`` (ml_dtypes, independent of lpjax and XLA)."""
    with np.errstate(over="ignore"):
        return values.astype(getattr(ml_dtypes, dtype, dtype)).astype(np.float64)


@pytest.mark.parametrize("dtype", FORMATS)
def test_overflow_threshold_matches_the_cast(dtype):
    fmt = number_format(dtype)
    thresholds = fmt.overflow_threshold * np.array([1 - 1e-6, 1.0, 1 + 1e-6])
    rounded = _cast(thresholds, dtype)
    assert np.array_equal(fmt.overflows(thresholds), ~np.isfinite(rounded))
    assert fmt.overflows(thresholds)[1] == fmt.overflow_at_threshold  # the tie: 65520 -> inf, but 464 -> 448


@pytest.mark.parametrize("dtype", FORMATS)
def test_underflow_and_flush_thresholds_match_the_cast(dtype):
    fmt = number_format(dtype)
    rng = np.random.default_rng(0)
    values = np.exp(rng.uniform(np.log(fmt.smallest_subnormal / 8), np.log(fmt.smallest_normal * 8), 10_000))
    rounded = _cast(values, dtype)
    flushed = values <= fmt.smallest_subnormal / 2
    assert np.array_equal(rounded == 0, flushed)
    subnormal_or_zero = values < fmt.smallest_normal
    assert np.all(np.abs(rounded[~subnormal_or_zero]) >= fmt.smallest_normal)
    assert np.all(np.abs(rounded[subnormal_or_zero]) <= fmt.smallest_normal)


@pytest.mark.parametrize("dtype", FORMATS)
def test_half_an_ulp_is_absorbed_and_more_is_not(dtype):
    fmt = number_format(dtype)
    big = _cast(np.array([1.0, 3.0, 100.0, fmt.smallest_normal * 4]), dtype)  # representable operands
    half_ulp = fmt.ulp(big) / 2
    assert np.array_equal(_cast(big + half_ulp * 0.99, dtype), _cast(big, dtype))
    assert np.all(_cast(big + half_ulp * 1.01, dtype) > big)


def test_known_constants_and_errors():
    f16 = number_format(jnp.float16)
    assert (f16.max, f16.smallest_normal, f16.smallest_subnormal, f16.nmant) == (65504.0, 2.0**-14, 2.0**-24, 10)
    assert f16.overflow_threshold == 65520.0 and f16.bits == 16
    assert number_format("float8_e4m3fn").overflow_threshold == 464.0
    assert is_narrow(jnp.bfloat16) and not is_narrow(jnp.float32) and not is_narrow(jnp.int8)
    with pytest.raises(ValueError, match="floating"):
        number_format(jnp.int32)
