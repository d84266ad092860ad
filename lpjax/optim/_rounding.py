"""Rounding into a narrower float dtype: round-to-nearest that XLA keeps, subnormals included, the random choice
between two neighbours that stochastic rounding makes, and the counter-based random bits it draws.

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

Random bits. Stochastic rounding (of parameters, targets and 8-bit moments) draws one 32-bit word per element from
Threefry-2x32 (Salmon et al., 2011; the generator behind ``jax.random``) keyed by a per-step key and counting the
element's identity, ``(leaf index, index within the leaf)`` (:func:`lpjax.optim.flat.element_positions`). The bits
are therefore the same whether a tree is stored per leaf or in one flat buffer, and the generator is written with
elementwise integer arithmetic, which XLA fuses into the rounding's own kernel.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lpjax.optim.flat import FlatBuffer, element_positions, is_flat_buffer


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


def choose_far(x: jax.Array, near: jax.Array, far: jax.Array, bits: jax.Array) -> jax.Array:
    """True with probability ``(x - near) / (far - near)``, per element: where a stochastic rounding of ``x``
    (between its neighbours ``near`` and ``far``, given in ``x``'s dtype) takes ``far``, so that its expectation
    is ``x``. False where the neighbours coincide or are not a finite distance apart. ``bits`` are uint32 random
    words of ``x``'s shape (:func:`element_bits`), read as float32 uniforms in [0, 1) (:func:`uniform`).
    """
    gap = far - near
    apart = (far != near) & jnp.isfinite(gap)
    p_far = jnp.where(apart, (x - near) / jnp.where(apart, gap, jnp.ones_like(gap)), jnp.zeros_like(gap))
    return uniform(bits).astype(x.dtype) < p_far


_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def threefry2x32(key: jax.Array, x0: jax.Array, x1: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Threefry-2x32 with 20 rounds, elementwise: the two uint32 output words for counters ``(x0, x1)`` under the
    uint32[2] ``key``; bit for bit ``jax.random``'s ``threefry2x32`` primitive."""
    k0, k1 = key[0], key[1]
    schedule = (k0, k1, k0 ^ k1 ^ jnp.uint32(0x1BD11BDA))
    x0, x1 = x0 + schedule[0], x1 + schedule[1]
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x0 = x0 + x1
            x1 = ((x1 << jnp.uint32(r)) | (x1 >> jnp.uint32(32 - r))) ^ x0
        x0 = x0 + schedule[(i + 1) % 3]
        x1 = x1 + schedule[(i + 2) % 3] + jnp.uint32(i + 1)
    return x0, x1


def fold_key(key: jax.Array, word: int | jax.Array) -> jax.Array:
    """A new uint32[2] key: Threefry of the counter ``(0, word)`` under ``key`` (an int or uint32 ``word``)."""
    return jnp.stack(threefry2x32(key, jnp.zeros([], jnp.uint32), jnp.asarray(word, jnp.uint32)))


def split_key(key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(next key, key for this step)`` from a uint32[2] ``key``, in elementwise arithmetic (no
    ``jax.random.split``, whose rolled loop costs several kernels per call)."""
    return fold_key(key, 0), fold_key(key, 1)


def element_bits(key: jax.Array, tree: Any) -> Any:
    """One uint32 random word per element of ``tree``: Threefry of ``(leaf index, index within the leaf)`` under
    ``key``, in a tree of ``tree``'s structure (a :class:`~lpjax.optim.flat.FlatBuffer` gets a FlatBuffer of
    bits, with the positions of its segments). The words are the same for a tree stored per leaf and for its
    flat buffers."""
    nodes, treedef = jax.tree.flatten(tree, is_leaf=is_flat_buffer)
    out = []
    for index, node in enumerate(nodes):
        leaf_ids, element_ids = element_positions(node, index)
        bits = threefry2x32(key, leaf_ids, element_ids)[0]
        out.append(FlatBuffer(bits, node.segments) if isinstance(node, FlatBuffer) else bits)
    return treedef.unflatten(out)


def uniform(bits: jax.Array) -> jax.Array:
    """uint32 words as float32 uniforms in [0, 1): the top 23 bits as the mantissa of a number in [1, 2), minus 1
    (as ``jax.random.uniform``)."""
    one_to_two = jax.lax.bitcast_convert_type((bits >> jnp.uint32(9)) | jnp.uint32(0x3F800000), jnp.float32)
    return one_to_two - jnp.float32(1.0)
