"""Rounding into a narrower float dtype: round-to-nearest that XLA keeps, subnormals included, and the random
choice between two neighbours that stochastic rounding makes.

``x.astype(float16).astype(float32)`` may be simplified away by XLA under ``xla_allow_excess_precision`` (its
default; GPU fusions use it), and ``lax.reduce_precision``, which that flag does not remove, flushes the target's
subnormals to zero (float16 values below ``2^-14``). :func:`round_to_nearest` combines the two: values in the
target's normal range go through ``reduce_precision``; below it, the target's subnormals are the multiples of its
smallest subnormal ``s``, so the rounding is ``round(x / s) * s``, computed exactly in ``x``'s dtype with a power
of two (ties to even, as the cast). Both are arithmetic XLA must keep.

A target with as many exponent bits as ``x``'s dtype (bfloat16 from float32) has ``x``'s own subnormals, which
``reduce_precision`` rounds bit for bit: it alone is the rounding. (Its ``1 / s`` would not fit in ``x``'s dtype,
and a product of two factors that do is folded by XLA into one that overflows.) Arithmetic on the result may still
flush them (XLA:CPU flushes float32 subnormals to zero); float16's subnormals are normal float32 values and are
kept.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def round_to_nearest(x: jax.Array, dtype: Any) -> jax.Array:
    """``x`` rounded to nearest (ties to even) in ``dtype``, returned in ``x``'s dtype; a rounding XLA keeps.

    ``dtype`` is a float dtype at most as wide as ``x``'s, with the same or fewer exponent bits.
    """
    if np.dtype(x.dtype) == np.dtype(dtype):
        return x
    finfo = jnp.finfo(np.dtype(dtype))
    normal = jax.lax.reduce_precision(x, exponent_bits=finfo.nexp, mantissa_bits=finfo.nmant)
    if finfo.nexp >= jnp.finfo(x.dtype).nexp:
        return normal
    small = jnp.abs(x) < jnp.asarray(finfo.smallest_normal, x.dtype)
    exponent = int(np.log2(float(finfo.smallest_subnormal)))
    scaled = jnp.where(small, x, jnp.zeros_like(x)) * jnp.asarray(2.0**-exponent, x.dtype)  # only small values
    subnormal = jnp.round(scaled) * jnp.asarray(2.0**exponent, x.dtype)
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
