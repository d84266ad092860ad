"""Blockwise 8-bit storage for optimizer moments, in the spirit of bitsandbytes' 8-bit Adam (Dettmers et al., 2022).

A moment tensor is flattened and cut into blocks of ``block_size`` consecutive elements (the last block may be
shorter; a tensor smaller than a block is one block of its own size). Each block stores 8-bit codes and one
float32 scale, its largest magnitude; codes are relative to the code format's largest value ``q``:

    scale_b = max_{i in b} |x_i|,      code_i = round(q x_i / scale_b),      x_i ~ (code_i / q) scale_b

Code formats (:data:`QUANTIZED_MOMENT_DTYPES`): ``int8`` (linear, ``q = 127``) and float8 ``e4m3``
(``q = 448``) or ``e5m2`` (``q = 57344``), whose codes are themselves floating point, so small elements of a block
keep their relative precision over 17 (e4m3) or 31 (e5m2) binades below the block's maximum.

A block's largest element is stored exactly (its code is ``+-q``, its value the scale), and with
``block_size = 1`` every element is: the moments are then float32 values, and the optimizer is its
float32-moment self. Memory: one byte per element plus ``4 / block_size``.

Rounding. Codes are rounded to nearest by default. An optimizer's moments are exponential averages that change
by a small fraction per step (``1 - sqrt(b2) = 5e-4`` for ``w``): rounded to nearest, a code would stay where it
is for ever, the same stall float16 parameters suffer. hAdam therefore rounds them stochastically (``bits``: one
random uint32 word per element, :func:`lpjax.optim._rounding.element_bits`),
which makes every stored moment unbiased, ``E[(code / q) scale] = x``, and lets a decaying ``w`` decay. hAdam's
denominator ``w`` is also kept nonzero (``keep_nonzero``): a positive ``w`` below the smallest code of its
block is stored as that smallest code, never as 0, so ``m / (w + eps)`` cannot blow up through quantization.

Units. Quantization is applied to the moments as hAdam stores them, in units of its ``moment_scale``; the
loss scaler's change of unit is a float32 multiplication of the dequantized values before they are quantized
again (:mod:`lpjax.optim.hadam`), so a rescale never touches the codes, and a block's relative error does not
depend on the loss scale.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lpjax.optim._rounding import choose_far, uniform

QUANTIZED_MOMENT_DTYPES = {
    np.dtype(jnp.int8): 127.0,
    np.dtype(jnp.float8_e4m3fn): 448.0,
    np.dtype(jnp.float8_e5m2): 57344.0,
}
"""The 8-bit code formats and their largest code magnitude ``q``."""

DEFAULT_BLOCK_SIZE = 256


def is_quantized_dtype(dtype: Any) -> bool:
    """Whether ``dtype`` (a dtype or ``None``) is one of :data:`QUANTIZED_MOMENT_DTYPES`."""
    return dtype is not None and np.dtype(dtype) in QUANTIZED_MOMENT_DTYPES


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class BlockQuantized:
    """A blockwise-quantized tensor: ``codes`` ``[num_blocks, block]`` (8-bit), ``scales`` ``[num_blocks]``
    (float32), and the tensor's ``shape`` (static). Its leaves are ``codes`` and ``scales``."""

    codes: jax.Array
    scales: jax.Array
    shape: tuple[int, ...] = dataclasses.field(metadata=dict(static=True))

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def dtype(self):
        return self.codes.dtype


def _blocks(size: int, block_size: int) -> tuple[int, int]:
    block = max(1, min(block_size, size))
    return -(-size // block), block


def _round_codes(ratio: jax.Array, code_dtype: np.dtype, q: float, bits: jax.Array | None) -> jax.Array:
    """``ratio`` (float32, within ``[-q, q]``) as codes: to nearest, or stochastically given ``bits`` (uint32
    random words of ``ratio``'s shape)."""
    if code_dtype == np.dtype(jnp.int8):
        if bits is None:
            return jnp.round(ratio).astype(jnp.int8)
        return jnp.floor(ratio + uniform(bits)).astype(jnp.int8)
    nearest = ratio.astype(code_dtype)
    if bits is None:
        return nearest
    # The neighbour on ratio's other side, toward +-q (float8_e4m3fn has no inf to step toward).
    toward = jnp.where(nearest.astype(jnp.float32) > ratio, -q, q).astype(code_dtype)
    other = jnp.nextafter(nearest, toward)
    take_far = choose_far(ratio, nearest.astype(jnp.float32), other.astype(jnp.float32), bits)  # never at +-q
    return jnp.where(take_far, other, nearest)


def quantize(
    x: jax.Array,
    code_dtype: Any,
    block_size: int = DEFAULT_BLOCK_SIZE,
    bits: jax.Array | None = None,
    keep_nonzero: bool = False,
) -> BlockQuantized:
    """``x`` (any float dtype) as a :class:`BlockQuantized` with ``code_dtype`` codes (see the module docstring).

    Args:
      x: the tensor.
      code_dtype: one of :data:`QUANTIZED_MOMENT_DTYPES`.
      block_size: elements per block.
      bits: ``None`` rounds each code to nearest; uint32 random words of ``x``'s shape round stochastically
        (``E[code] = q x / scale``).
      keep_nonzero: a nonzero element whose code would be 0 gets the smallest code of its sign instead.

    Non-finite elements make their block's scale non-finite.
    """
    code_dtype = np.dtype(code_dtype)
    if code_dtype not in QUANTIZED_MOMENT_DTYPES:
        raise ValueError(
            f"quantize: codes must be one of {sorted(map(str, QUANTIZED_MOMENT_DTYPES))}, got {code_dtype}."
        )
    if block_size < 1:
        raise ValueError(f"quantize: block_size must be >= 1, got {block_size}.")
    q = QUANTIZED_MOMENT_DTYPES[code_dtype]
    shape = tuple(jnp.shape(x))
    num_blocks, block = _blocks(math.prod(shape), block_size)
    padding = num_blocks * block - math.prod(shape)
    blocks = jnp.pad(jnp.ravel(x).astype(jnp.float32), (0, padding)).reshape(num_blocks, block)
    if bits is not None:
        bits = jnp.pad(jnp.ravel(bits), (0, padding)).reshape(num_blocks, block)
    absmax = jnp.max(jnp.abs(blocks), axis=1)
    scales = jnp.where(absmax > 0, absmax, jnp.ones_like(absmax))
    divisor = jnp.where(jnp.isfinite(scales), scales, jnp.ones_like(scales))[:, None]
    ratio = jnp.clip(blocks / divisor * q, -q, q)  # exactly +-q at the block's largest element
    codes = _round_codes(ratio, code_dtype, q, bits)
    if keep_nonzero:
        if code_dtype == np.dtype(jnp.int8):
            smallest = 1.0
        else:
            smallest = float(jnp.finfo(code_dtype).smallest_subnormal)
        floor = (jnp.sign(ratio) * smallest).astype(code_dtype)
        codes = jnp.where((codes == 0) & (ratio != 0), floor, codes)
    return BlockQuantized(codes, scales, shape)


def dequantize(x: BlockQuantized, dtype: Any = jnp.float32) -> jax.Array:
    """The tensor ``(codes / q) * scale`` (computed in float32) in ``dtype``, of shape ``x.shape``."""
    q = QUANTIZED_MOMENT_DTYPES[np.dtype(x.codes.dtype)]
    values = x.codes.astype(jnp.float32) / q * x.scales[:, None]
    return jnp.ravel(values)[: x.size].reshape(x.shape).astype(dtype)


def zeros(shape: tuple[int, ...], code_dtype: Any, block_size: int = DEFAULT_BLOCK_SIZE) -> BlockQuantized:
    """The :class:`BlockQuantized` zero tensor (codes 0, scales 1: the scale of an all-zero block)."""
    num_blocks, block = _blocks(math.prod(shape), block_size)
    return BlockQuantized(
        jnp.zeros((num_blocks, block), code_dtype), jnp.ones((num_blocks,), jnp.float32), tuple(shape)
    )


def max_abs(x: BlockQuantized) -> jax.Array:
    """The largest magnitude ``x`` holds, in float32: the largest scale (a block's largest element is stored as
    ``+-q``, so its value is the scale itself)."""
    return jnp.max(x.scales)


__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "QUANTIZED_MOMENT_DTYPES",
    "BlockQuantized",
    "dequantize",
    "is_quantized_dtype",
    "max_abs",
    "quantize",
    "zeros",
]
