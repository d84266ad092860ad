"""Symmetric absmax int8 quantization, per tensor, per channel or per token.

For a slice ``S`` of ``x`` that shares one scale::

    s = amax(|S|) / 127                        (s = 1 for an all-zero slice)
    q = clip(round(S / s), -127, 127)          (int8, round half to even; -128 is never used)
    S ~= q * s

so ``|S - q s| <= s / 2 = amax(|S|) / 254`` element-wise, up to float32 rounding (relative ``2^-23``). Both
divisions are computed as multiplications by a correctly rounded float32 reciprocal, ``s = amax * f32(1/127)``
and ``S * f32(1/s)`` (XLA:CPU evaluates every float32 division this way anyway), so the codes, ties of the
rounding included, are bit-identical on every backend and in NumPy.

Weights ``w: (K, N)`` get one scale per output channel (column, :func:`quantize_int8_weight`) and activations
``x: (M, K)`` one per token (row, :func:`quantize_int8_per_token`): then an int8 matmul is exact in int32 and
``x @ w ~= (q_x @ q_w) * s_x[:, None] * s_w[None, :]``. All functions compute in float32, accept any floating
input dtype, and are ``jax.jit``-compatible. Inputs must be finite.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

INT8_MAX = 127.0
"""Largest code magnitude: the range is symmetric, [-127, 127]."""

_TINY = float(np.finfo(np.float32).tiny)
_INV_INT8_MAX = np.float32(1.0 / INT8_MAX)


class Int8Weight(NamedTuple):
    """A weight matrix quantized to int8 with one scale per output channel (a pytree).

    Attributes:
      codes: ``(K, N)`` int8, ``codes[k, n] = clip(round(w[k, n] / scales[n]), -127, 127)``.
      scales: ``(N,)`` float32, ``scales[n] = amax_k(|w[k, n]|) / 127`` (1 for an all-zero column).

    ``w ~= dequantize_int8(codes, scales)``; ``shape`` is ``codes.shape``.
    """

    codes: jax.Array
    scales: jax.Array

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape ``(K, N)`` of the quantized matrix."""
        return tuple(self.codes.shape)


def _check_float(name: str, x: jax.Array, ndim: int | None = None) -> jax.Array:
    x = jnp.asarray(x)
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {x.shape}.")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"{name} must have a floating dtype, got {x.dtype}.")
    return x


def quantize_int8(x: jax.Array, axis: int | Sequence[int] | None = None) -> tuple[jax.Array, jax.Array]:
    """Symmetric int8 quantization with one scale per tensor or per index along ``axis``.

    ``axis`` names the axes that *keep* their own scales (the channel axes); the amax is taken over all the
    others::

        scale = amax(|x|, over axes not in `axis`, keepdims) / 127     (1 where that amax is 0)
        codes = clip(round(x / scale), -127, 127).astype(int8)

    E.g. for ``x: (M, K)``, ``axis=0`` gives per-row (per-token) scales of shape ``(M, 1)``; for ``w: (K, N)``,
    ``axis=1`` gives per-column (per-output-channel) scales of shape ``(1, N)``.

    Args:
      x: array of any floating dtype, finite.
      axis: ``None`` for a single scale, else an axis or a sequence of axes (negative allowed).

    Returns:
      ``(codes, scale)``: int8 codes of ``x``'s shape, and float32 scales of shape ``()`` (per tensor) or
      ``x``'s shape with every axis not in ``axis`` set to 1, so ``codes * scale`` broadcasts.
    """
    x = _check_float("x", x)
    if axis is None:
        reduce_axes = tuple(range(x.ndim))
    else:
        kept = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
        for a in kept:
            if not isinstance(a, (int, np.integer)) or not -x.ndim <= a < x.ndim:
                raise ValueError(f"axis {a!r} is out of range for an array of shape {x.shape}.")
        kept = {int(a) % x.ndim for a in kept}
        reduce_axes = tuple(a for a in range(x.ndim) if a not in kept)
    return _quantize(x, reduce_axes, axis is not None)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _quantize(x: jax.Array, reduce_axes: tuple[int, ...], keepdims: bool) -> tuple[jax.Array, jax.Array]:
    x = x.astype(jnp.float32)
    amax = jnp.max(jnp.abs(x), axis=reduce_axes, keepdims=keepdims, initial=0.0)
    # Zero slices get scale 1; nonzero scales are at least float32's smallest normal (no flushed divisor).
    scale = jnp.where(amax > 0, jnp.maximum(amax * _INV_INT8_MAX, _TINY), 1.0).astype(jnp.float32)
    codes = jnp.clip(jnp.round(x * (1.0 / scale)), -INT8_MAX, INT8_MAX).astype(jnp.int8)
    return codes, scale


def quantize_int8_weight(w: jax.Array) -> Int8Weight:
    """Quantizes a ``(K, N)`` weight per output channel: ``quantize_int8(w, axis=1)`` with ``(N,)`` scales.

    ``scales[n] = amax_k(|w[k, n]|) / 127`` and ``codes[k, n] = clip(round(w[k, n] / scales[n]), -127, 127)``.
    """
    w = _check_float("w", w, ndim=2)
    codes, scale = quantize_int8(w, axis=1)
    return Int8Weight(codes, scale.reshape(w.shape[1]))


def quantize_int8_per_token(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Dynamic per-token quantization of ``(M, K)`` activations: ``quantize_int8(x, axis=0)``.

    Returns ``(codes, scales)``: ``(M, K)`` int8 and ``(M, 1)`` float32 with
    ``scales[m] = amax_k(|x[m, k]|) / 127``.
    """
    x = _check_float("x", x, ndim=2)
    return quantize_int8(x, axis=0)


def dequantize_int8(codes: jax.Array, scale: jax.Array) -> jax.Array:
    """``codes * scale`` in float32; ``scale`` broadcasts against ``codes``.

    Works for all the quantizers here, e.g. ``dequantize_int8(*quantize_int8(x, axis))`` and, since ``(N,)``
    scales broadcast over the columns of ``(K, N)`` codes, ``dequantize_int8(qw.codes, qw.scales)``.
    """
    codes = jnp.asarray(codes)
    if codes.dtype != jnp.int8:
        raise ValueError(f"codes must be int8, got {codes.dtype}.")
    return codes.astype(jnp.float32) * jnp.asarray(scale, jnp.float32)
