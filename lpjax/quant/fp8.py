"""Blockwise FP8 (E4M3) quantization: DeepSeek-V3 / DeepGEMM "W8A8" scales.

Weights ``w: (K, N)`` are cut into ``block x block`` tiles (128 x 128 by default) and activations
``x: (M, K)`` into ``1 x group`` tiles (per token, per 128 columns of K). Each tile ``B`` gets its own
float32 scale and float8_e4m3fn codes::

    s = amax(|B|) / 448                 (s = 1 for an all-zero tile)
    q = e4m3(clip(B / s, -448, 448))    (round to nearest even)
    B ~= q * s

448 (:data:`E4M3_MAX`) is the largest finite float8_e4m3fn. The clip comes *before* the cast: a plain
``astype(float8_e4m3fn)`` maps magnitudes from 464 up (half-way to the next power-of-two step) to NaN, since the
format has no infinity, and ``amax / s`` can exceed 448 by a rounding error.

Tiles at the bottom/right border are partial when a dimension is not a multiple of the tile size: their scale
is the amax of the elements that exist (equivalently, of the tile zero-padded to full size).

Error of one round trip, element-wise (``q`` the exact ``w / s``): e4m3 has 3 explicit mantissa bits, so for
``|q| >= 2^-6`` (normal numbers) ``|w - deq(w)| <= 2^-4 |w|``; below that (subnormals, spacing ``2^-9``)
``|w - deq(w)| <= 2^-10 s``. Together: ``|w - deq(w)| <= max(2^-4 |w|, 2^-10 s) <= 2^-4 amax(tile)``, up to
float32 rounding of the division and the product (relative ``2^-23``).

Both divisions are computed as multiplications by a correctly rounded float32 reciprocal, ``s = amax *
f32(1/448)`` and ``B * f32(1/s)`` (each within one float32 ulp of the quotient; XLA:CPU evaluates every float32
division this way anyway), so codes and scales are bit-identical on every backend and in NumPy.

All functions compute in float32, accept any floating input dtype, and are ``jax.jit``-compatible (shapes and
block sizes are static). Inputs must be finite: a NaN or infinity makes its whole tile NaN.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

E4M3_MAX = 448.0
"""Largest finite float8_e4m3fn value; scales map each tile's absmax onto it."""

FP8_DTYPE = jnp.float8_e4m3fn
"""Storage dtype of FP8 codes."""

_TINY = float(np.finfo(np.float32).tiny)
_INV_E4M3_MAX = np.float32(1.0 / E4M3_MAX)


class Fp8BlockwiseWeight(NamedTuple):
    """A weight matrix quantized to FP8 in square tiles (a pytree, so it can cross ``jit`` and be stored).

    Attributes:
      codes: ``(K, N)`` float8_e4m3fn, the original (unpadded) shape; ``codes[k, n] = e4m3(w[k, n] / s)`` for
        the scale ``s`` of the tile holding ``(k, n)``.
      scales: ``(ceil(K / block), ceil(N / block))`` float32; ``scales[i, j] = amax(|w|)/448`` over the tile
        ``w[i*block:(i+1)*block, j*block:(j+1)*block]`` (1 for an all-zero tile). ``block`` is not stored: it is
        128 unless the weight was quantized with another ``block``, which must then be passed to
        :func:`dequantize_fp8_blockwise` too.

    ``w ~= dequantize_fp8_blockwise(qw)``; ``shape`` is ``codes.shape``.
    """

    codes: jax.Array
    scales: jax.Array

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape ``(K, N)`` of the quantized matrix."""
        return tuple(self.codes.shape)


def _check_block(name: str, size: int) -> int:
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size <= 0 or size & (size - 1):
        raise ValueError(f"{name} must be a positive power of two, got {size!r}.")
    return int(size)


def _check_float_matrix(name: str, x: jax.Array) -> jax.Array:
    x = jnp.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"{name} must be a matrix (2 dimensions), got shape {x.shape}.")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"{name} must have a floating dtype, got {x.dtype}.")
    return x


def _num_blocks(size: int, block: int) -> int:
    return -(-size // block)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _quantize_tiles(x: jax.Array, rows: int, cols: int) -> tuple[jax.Array, jax.Array]:
    """codes (R, C) e4m3 and scales (ceil(R/rows), ceil(C/cols)) f32 of ``x`` cut into ``rows x cols`` tiles."""
    r, c = x.shape
    rb, cb = _num_blocks(r, rows), _num_blocks(c, cols)
    x = x.astype(jnp.float32)
    x = jnp.pad(x, ((0, rb * rows - r), (0, cb * cols - c)))
    tiles = x.reshape(rb, rows, cb, cols)
    amax = jnp.max(jnp.abs(tiles), axis=(1, 3))
    # Zero tiles get scale 1 (zero codes, no 0/0). A nonzero scale below float32's smallest normal is raised to
    # it, so flush-to-zero of subnormals can never turn it into a division by zero.
    scales = jnp.where(amax > 0, jnp.maximum(amax * _INV_E4M3_MAX, _TINY), 1.0).astype(jnp.float32)
    q = jnp.clip(tiles * (1.0 / scales)[:, None, :, None], -E4M3_MAX, E4M3_MAX).astype(FP8_DTYPE)
    return q.reshape(rb * rows, cb * cols)[:r, :c], scales


def _dequantize_tiles(codes: jax.Array, scales: jax.Array, rows: int, cols: int) -> jax.Array:
    rb, cb = _num_blocks(codes.shape[0], rows), _num_blocks(codes.shape[1], cols)
    if scales.shape != (rb, cb):
        raise ValueError(
            f"scales of codes {codes.shape} in {rows}x{cols} tiles must have shape {(rb, cb)}, got {scales.shape}."
        )
    return _dequantize_tiles_jit(codes, scales, rows, cols)


@functools.partial(jax.jit, static_argnums=(2, 3))
def _dequantize_tiles_jit(codes: jax.Array, scales: jax.Array, rows: int, cols: int) -> jax.Array:
    r, c = codes.shape
    rb, cb = _num_blocks(r, rows), _num_blocks(c, cols)
    x = jnp.pad(codes.astype(jnp.float32), ((0, rb * rows - r), (0, cb * cols - c)))
    x = x.reshape(rb, rows, cb, cols) * scales.astype(jnp.float32)[:, None, :, None]
    return x.reshape(rb * rows, cb * cols)[:r, :c]


def quantize_fp8_blockwise(w: jax.Array, block: int = 128) -> Fp8BlockwiseWeight:
    """Quantizes a weight matrix to FP8 E4M3 with one scale per ``block x block`` tile.

    For the tile ``B = w[i*b:(i+1)*b, j*b:(j+1)*b]`` (partial at the borders)::

        scales[i, j] = amax(|B|) / 448          (1 if B == 0)
        codes[B]     = e4m3(clip(B / scales[i, j], -448, 448))

    so the largest element of every tile maps to +-448 and ``|w - dequantize(q)| <= 2^-4 amax(B)`` (see the
    module docstring for the sharper element-wise bound).

    Args:
      w: ``(K, N)`` matrix of any floating dtype, finite.
      block: tile side, a power of two (128 in DeepSeek-V3 and in :mod:`kernels.fp8_blockwise_matmul`).

    Returns:
      ``Fp8BlockwiseWeight(codes (K, N) float8_e4m3fn, scales (ceil(K/block), ceil(N/block)) float32)``.
    """
    w = _check_float_matrix("w", w)
    block = _check_block("block", block)
    codes, scales = _quantize_tiles(w, block, block)
    return Fp8BlockwiseWeight(codes, scales)


def dequantize_fp8_blockwise(qw: Fp8BlockwiseWeight, block: int = 128) -> jax.Array:
    """``w[k, n] ~= codes[k, n] * scales[k // block, n // block]``, as a float32 ``(K, N)`` matrix.

    Args:
      qw: the output of :func:`quantize_fp8_blockwise`.
      block: the tile side it was quantized with.
    """
    block = _check_block("block", block)
    codes = jnp.asarray(qw.codes)
    if codes.ndim != 2:
        raise ValueError(f"codes must be a matrix (K, N), got shape {codes.shape}.")
    return _dequantize_tiles(codes, jnp.asarray(qw.scales), block, block)


def quantize_fp8_per_token_group(x: jax.Array, group: int = 128) -> tuple[jax.Array, jax.Array]:
    """Dynamic activation quantization: one scale per token (row) per ``group`` consecutive columns of K.

    For the group ``x[m, g*G:(g+1)*G]`` (the last one partial if ``G`` does not divide K)::

        scales[m, g] = amax(|x[m, g*G:(g+1)*G]|) / 448     (1 if the group is all zero)
        codes[m, k]  = e4m3(clip(x[m, k] / scales[m, k // G], -448, 448))

    Args:
      x: ``(M, K)`` activations of any floating dtype, finite.
      group: group width G, a power of two (128 in DeepSeek-V3).

    Returns:
      ``(codes, scales)``: ``(M, K)`` float8_e4m3fn and ``(M, ceil(K / group))`` float32.
    """
    x = _check_float_matrix("x", x)
    group = _check_block("group", group)
    return _quantize_tiles(x, 1, group)


def dequantize_fp8_per_token_group(codes: jax.Array, scales: jax.Array, group: int = 128) -> jax.Array:
    """``x[m, k] ~= codes[m, k] * scales[m, k // group]``, as a float32 ``(M, K)`` matrix.

    Args:
      codes: ``(M, K)`` float8_e4m3fn codes of :func:`quantize_fp8_per_token_group`.
      scales: ``(M, ceil(K / group))`` float32 scales.
      group: the group width they were quantized with.
    """
    group = _check_block("group", group)
    codes = jnp.asarray(codes)
    if codes.ndim != 2:
        raise ValueError(f"codes must be a matrix (M, K), got shape {codes.shape}.")
    return _dequantize_tiles(codes, jnp.asarray(scales), 1, group)
