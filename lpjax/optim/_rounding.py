"""Rounding into a narrower float dtype: round-to-nearest that XLA keeps, subnormals included, and the random
choice between two neighbours that stochastic rounding makes.

``x.astype(float16).astype(float32)`` may be simplified away by XLA under ``xla_allow_excess_precision`` (its
default; GPU fusions use it), and ``lax.reduce_precision``, which that flag does not remove, flushes the target's
subnormals to zero (float16 values below ``2^-14``). :func:`round_to_nearest` combines the two: values in the
target's normal range go through ``reduce_precision``; below it, the target's subnormals are the multiples of its
smallest subnormal ``s``, so the rounding is ``round(x / s) * s``, computed exactly in ``x``'s dtype with powers of
two (ties to even, as the cast). Both are arithmetic XLA must keep.

bfloat16's subnormals are float32 subnormals, which XLA:CPU flushes to zero in float32 arithmetic; there they round
to zero (float16's subnormals are normal float32 values and round exactly).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def _power_of_two(exponent: int, dtype) -> list[jax.Array]:
    """Factors, each a power of two representable in ``dtype``, whose product is ``2 ** exponent``."""
    limit = jnp.finfo(dtype).maxexp - 1
    factors, remaining = [], exponent
    while remaining:
        step = max(-limit, min(limit, remaining))
        factors.append(jnp.asarray(2.0**step, dtype))
        remaining -= step
    return factors


def round_to_nearest(x: jax.Array, dtype: Any) -> jax.Array:
    """``x`` rounded to nearest (ties to even) in ``dtype``, returned in ``x``'s dtype; a rounding XLA keeps.

    ``dtype`` is a float dtype at most as wide as ``x``'s, with the same or fewer exponent bits.
    """
    if np.dtype(x.dtype) == np.dtype(dtype):
        return x
    finfo = jnp.finfo(np.dtype(dtype))
    normal = jax.lax.reduce_precision(x, exponent_bits=finfo.nexp, mantissa_bits=finfo.nmant)
    small = jnp.abs(x) < jnp.asarray(finfo.smallest_normal, x.dtype)
    exponent = int(np.log2(float(finfo.smallest_subnormal)))
    scaled = jnp.where(small, x, jnp.zeros_like(x))  # only the small values are scaled up: nothing overflows
    for factor in _power_of_two(-exponent, x.dtype):
        scaled = scaled * factor
    subnormal = jnp.round(scaled)
    for factor in _power_of_two(exponent, x.dtype):
        subnormal = subnormal * factor
    return jnp.where(small, subnormal, normal)


def choose_far(x: jax.Array, near: jax.Array, far: jax.Array, key: jax.Array) -> jax.Array:
    """True with probability ``(x - near) / (far - near)``, per element: where a stochastic rounding of ``x``
    (between its neighbours ``near`` and ``far``, given in ``x``'s dtype) takes ``far``, so that its expectation
    is ``x``. False where the neighbours coincide or are not a finite distance apart. The uniforms are drawn in
    float32 with ``jax.random.uniform(key, x.shape)``.
    """
    gap = far - near
    apart = (far != near) & jnp.isfinite(gap)
    p_far = jnp.where(apart, (x - near) / jnp.where(apart, gap, jnp.ones_like(gap)), jnp.zeros_like(gap))
    return jax.random.uniform(key, x.shape, dtype=jnp.float32).astype(x.dtype) < p_far
