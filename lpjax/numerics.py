"""fp16-safe numerical primitives (Björck et al., 2021, Sec. 4 and appendix C).

Each function equals its textbook formula in exact arithmetic and differs only in the order of operations,
chosen so that float16 (max 65504, smallest subnormal 6e-8, 11 significant bits) neither overflows nor
underflows where the textbook formula does. Every function returns the dtype of its inputs.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


@jax.custom_jvp
def _standardize(x: jax.Array, loc: jax.Array, scale: jax.Array) -> jax.Array:
    """``z = (x - loc) / scale`` with the derivative ``dz = (dx - dloc - z dscale) / scale``.

    JAX's own derivative of the quotient goes through ``scale^-2``, which overflows float16 for
    ``scale < 2^-8`` (``log sigma < -5.5``, inside the pixel agent's bounds) although ``z / scale`` fits.
    """
    return (x - loc) / scale


@_standardize.defjvp
def _standardize_jvp(primals, tangents):
    x, loc, scale = primals
    dx, dloc, dscale = tangents
    z = _standardize(x, loc, scale)
    return z, (dx - dloc - z * dscale) / scale


def normal_log_prob(x: jax.Array, loc: jax.Array, scale: jax.Array) -> jax.Array:
    """normal-fix: elementwise Gaussian log-density computed as ``-((x - mu) / sigma)^2 / 2``.

    ``log N(x; mu, sigma) = -0.5 ((x - mu) / sigma)^2 - log(sigma) - 0.5 log(2 pi)``.

    The textbook ``(x - mu)^2 / sigma^2`` squares ``sigma`` first: ``sigma = exp(-10)`` gives ``sigma^2 = 2e-9``,
    which is 0 in float16 (``exp(-5)`` keeps only 9 of 11 significant bits as a subnormal), and ``(x - mu)^2``
    overflows for ``|x - mu| > 256``. Dividing first keeps the ratio in range; ``(-0.5 z) z`` rather than
    ``-0.5 z^2`` keeps the result finite for ``256 <= |z| < 362`` where it is representable; the derivative
    with respect to ``sigma`` avoids ``sigma^-2`` (see ``_standardize``).
    """
    dtype = jnp.result_type(x, loc, scale)
    x, loc, scale = (jnp.asarray(v, dtype) for v in (x, loc, scale))
    z = _standardize(x, loc, scale)
    return (-0.5 * z) * z - jnp.log(scale) - jnp.asarray(_HALF_LOG_2PI, z.dtype)


def tanh_log_det_jacobian(u: jax.Array) -> jax.Array:
    """``log(1 - tanh(u)^2) = 2 (log 2 - |u| - log1p(exp(-2|u|)))``, finite in float16 for every finite ``u``.

    The direct form ``log(1 - tanh(u)^2)`` is ``log(0) = -inf`` in float16 once ``|u| > 4.5`` (tanh rounds to 1).
    Using ``|u|`` keeps the argument of ``exp`` non-positive, so nothing overflows and no softplus limit is
    needed: the identity is exact for every ``u``, and the derivative is ``-2 tanh(u)`` (0 at ``u = 0``).
    """
    a = jnp.abs(jnp.asarray(u))
    return 2.0 * (jnp.asarray(math.log(2.0), a.dtype) - a - jnp.log1p(jnp.exp(-2.0 * a)))


def weight_standardize(kernel: jax.Array, eps: float = 1e-5) -> jax.Array:
    """Weight standardization (Qiao et al., 2019): zero mean, unit variance per output unit.

    ``W_hat[..., j] = (W[..., j] - mean_j) / sqrt(var_j + eps)`` with the statistics taken over every axis but the
    last (fan-in of a Flax ``Dense`` ``(in, out)`` or ``Conv`` ``(h, w, in, out)`` kernel). Statistics are
    accumulated in float32 and the result is returned in the kernel's dtype, so a float16 kernel of any fan-in
    gives a float16 kernel whose entries are O(1).
    """
    kernel = jnp.asarray(kernel)
    if kernel.ndim < 2:
        raise ValueError(f"weight_standardize expects a kernel with >= 2 dims (fan-in..., out), got {kernel.shape}.")
    w = kernel.astype(jnp.promote_types(kernel.dtype, jnp.float32))
    axes = tuple(range(kernel.ndim - 1))
    mean = jnp.mean(w, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(w - mean), axis=axes, keepdims=True)
    return ((w - mean) * jax.lax.rsqrt(var + eps)).astype(kernel.dtype)


@jax.custom_jvp
def hypot(x: jax.Array, y: jax.Array) -> jax.Array:
    """``sqrt(x^2 + y^2)`` without forming the squares: ``M sqrt(1 + (m/M)^2)``, ``M = max(|x|,|y|)``, ``m = min``.

    The squares overflow float16 for ``|x| > 256`` and underflow below ``2.4e-4``; the scaled form is exact to a
    few ulps over the whole range. It is evaluated in float32 (float64 for float64 inputs) and rounded once, and
    it is symmetric and sign-blind by construction: ``hypot(x, y) == hypot(-y, x)`` bit for bit. An infinite
    operand gives ``inf`` (also against a nan), as in IEEE 754. The derivative ``(x dx + y dy) / hypot`` is
    defined as 0 at the origin.
    """
    dtype = jnp.result_type(x, y)
    wide = jnp.promote_types(dtype, jnp.float32)
    ax, ay = jnp.abs(jnp.asarray(x, wide)), jnp.abs(jnp.asarray(y, wide))
    big, small = jnp.maximum(ax, ay), jnp.minimum(ax, ay)
    ratio = small / jnp.where(big == 0, jnp.ones_like(big), big)
    h = big * jnp.sqrt(1 + ratio * ratio)
    return jnp.where(jnp.isinf(ax) | jnp.isinf(ay), jnp.inf, h).astype(dtype)


@hypot.defjvp
def _hypot_jvp(primals, tangents):
    x, y = primals
    dx, dy = tangents
    h = hypot(x, y)
    safe_h = jnp.where(h == 0, jnp.ones_like(h), h)
    dh = jnp.where(h == 0, jnp.zeros_like(h), (x / safe_h) * dx + (y / safe_h) * dy)
    return h, dh
