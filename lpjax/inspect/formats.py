"""The number formats the precision inspector checks values against, and what rounding into them does.

A binary floating-point format with ``p = nmant`` stored mantissa bits represents normal numbers
``|x| = 1.f * 2^e`` for ``e`` in ``[e_min, e_max]`` and subnormals ``0.f * 2^e_min`` below. Rounding an exact
value ``x`` to nearest (ties to even) into it

* overflows (to ``inf``, or ``nan`` in formats without ``inf`` such as float8_e4m3fn) when
  ``|x| > max + ulp(max) / 2``, or at equality when ``max``'s last mantissa bit is odd (ties go to even:
  float16's ``65520`` overflows, float8_e4m3fn's ``464`` rounds to ``448``);
* underflows (becomes subnormal, losing precision, or zero) when ``0 < |x| < smallest_normal``, and flushes to
  zero when ``|x| <= smallest_subnormal / 2``;
* absorbs the smaller operand of a sum ``a + b`` (the result is the larger operand, unchanged) when
  ``min(|a|, |b|) < ulp(max(|a|, |b|)) / 2``, with ``ulp(x) = 2^(floor(log2 |x|) - p)`` for normal ``x``.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class NumberFormat:
    """Range and resolution of a floating-point dtype, as the inspector uses them (all thresholds exact floats).

    Attributes:
      name: the dtype's name (``"float16"``, ``"bfloat16"``, ``"float8_e4m3fn"``, ...).
      nmant: stored mantissa bits ``p``.
      max: largest finite value.
      smallest_normal: ``2^e_min``.
      smallest_subnormal: ``2^(e_min - p)``.
      overflow_threshold: ``max + ulp(max) / 2``: exact values above it round out of range.
      overflow_at_threshold: whether the tie at ``overflow_threshold`` rounds out of range too.
    """

    name: str
    nmant: int
    max: float
    smallest_normal: float
    smallest_subnormal: float
    overflow_threshold: float
    overflow_at_threshold: bool

    def overflows(self, magnitude: np.ndarray) -> np.ndarray:
        """Whether exact magnitudes ``|x|`` round out of this format's range."""
        if self.overflow_at_threshold:
            return magnitude >= self.overflow_threshold
        return magnitude > self.overflow_threshold

    @property
    def bits(self) -> int:
        return np.dtype(self.name).itemsize * 8

    def ulp(self, magnitude: np.ndarray) -> np.ndarray:
        """``ulp(|x|)`` in this format: ``2^(floor(log2 |x|) - p)`` for normal ``|x|``, the smallest subnormal below."""
        magnitude = np.maximum(np.asarray(magnitude, np.float64), self.smallest_normal)
        _, exponent = np.frexp(magnitude)  # magnitude = m 2^exponent, m in [0.5, 1)
        return np.ldexp(1.0, exponent - 1 - self.nmant)


def number_format(dtype) -> NumberFormat:
    """The :class:`NumberFormat` of a floating dtype (float64 ... float8); raises ``ValueError`` for others."""
    try:
        dtype = np.dtype(dtype)
        info = jnp.finfo(dtype)
    except (TypeError, ValueError) as error:
        raise ValueError(f"The precision inspector checks floating dtypes, got {dtype!r}.") from error
    maximum = float(info.max)
    _, exponent = np.frexp(maximum)
    ulp_max = float(np.ldexp(1.0, exponent - 1 - info.nmant))
    return NumberFormat(
        name=dtype.name,
        nmant=int(info.nmant),
        max=maximum,
        smallest_normal=float(info.smallest_normal),
        smallest_subnormal=float(info.smallest_subnormal),
        overflow_threshold=maximum + ulp_max / 2,
        overflow_at_threshold=bool(int(maximum / ulp_max) % 2),
    )


def is_narrow(dtype) -> bool:
    """Whether ``dtype`` is a floating dtype narrower than float32 (float16, bfloat16, the float8 formats)."""
    dtype = np.dtype(dtype)
    return jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize < 4
