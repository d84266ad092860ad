"""Quantization-aware training (QAT, QuaRL): fake quantization with a straight-through gradient.

The forward pass sees the quantized-then-dequantized weights of :mod:`lpjax.quant.uniform`,

    fake_quantize(W) = D(Q(W)) = delta * round(W / delta),    delta = (|min(W, 0)| + |max(W, 0)|) / 2^n,

and the backward pass uses the straight-through estimator (STE, Bengio et al. 2013; the QuaRL paper's "during
backpropagation the straight through estimator is used as the gradient of Q_n"):

    d fake_quantize(W) / dW := I      (the identity, everywhere).

The gradient is **not** clipped outside a range: the papers use the plain STE, and with this quantizer nothing
is ever out of range anyway (``delta`` is chosen from the tensor's own min and max, so no value is clipped in
the forward pass, and the clipped STE of e.g. TensorFlow's fake-quant ops would equal the plain one). The step
``delta`` depends on ``W`` through its min and max; the STE treats it as a constant (no gradient flows into it).

Quantization delay (QuaRL trains Atari agents for 5M steps in full precision before QAT starts):
:func:`fake_quantize_params` fake-quantizes the weight leaves of a parameter tree only from ``step >= delay``;
``step`` may be a traced integer (inside ``jit``), the switch is a ``lax.cond``. Before the delay the parameters
pass through unchanged; either way the gradient with respect to the parameters is the identity's.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lpjax.quant.uniform import _check_bits, _check_float, _quantize, _reduce_axes


def fake_quantize(x: jax.Array, bits: int, axis: int | Sequence[int] | None = None) -> jax.Array:
    """``D(Q(x))`` in the forward pass, identity gradient (straight-through) in the backward pass.

    Args:
      x: array of any floating dtype, finite.
      bits: ``n``, an integer in [2, 16] (see :func:`lpjax.quant.uniform_quantize`).
      axis: ``None`` for one step per tensor, else the axes that keep their own step (``-1``: per output
        channel of a Dense kernel).

    Returns:
      ``delta * round(x / delta)`` with ``x``'s shape and dtype (computed in float32, then cast), so
      ``|x - fake_quantize(x)| <= delta / 2`` up to the final cast. Its derivative is defined as the identity
      (``jax.grad``, ``jax.vjp`` and ``jax.jvp`` alike).
    """
    x = _check_float("x", x)
    bits = _check_bits(bits)
    return _fake_quantize(x, bits, _reduce_axes(x.shape, axis), axis is not None)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2, 3))
def _fake_quantize(x: jax.Array, bits: int, reduce_axes: tuple[int, ...], keepdims: bool) -> jax.Array:
    codes, delta = _quantize(x, bits, reduce_axes, keepdims)
    return (codes.astype(jnp.float32) * delta).astype(x.dtype)


@_fake_quantize.defjvp
def _fake_quantize_jvp(bits, reduce_axes, keepdims, primals, tangents):
    (x,), (x_dot,) = primals, tangents
    return _fake_quantize(x, bits, reduce_axes, keepdims), x_dot  # straight-through: d/dx := identity


def _is_weight(x: Any) -> bool:
    return hasattr(x, "dtype") and hasattr(x, "ndim") and jnp.issubdtype(x.dtype, jnp.floating) and x.ndim >= 2


def _fake_quantize_weights(params: Any, bits: int, per_channel: bool) -> Any:
    def leaf(x):
        return fake_quantize(x, bits, -1 if per_channel else None) if _is_weight(x) else x

    return jax.tree.map(leaf, params)


def fake_quantize_params(
    params: Any, bits: int, step: int | jax.Array, delay: int | jax.Array, per_channel: bool = False
) -> Any:
    """Fake-quantizes the weights of ``params`` once training has reached the quantization delay.

    ``weights`` are the floating leaves with ``ndim >= 2`` (Dense and convolution kernels); biases, scalars and
    non-floating leaves always pass through, as in the papers. Use it inside the loss, on the parameters that
    the forward pass sees::

        def loss_fn(params, batch, step):
            q_params = fake_quantize_params(params, 8, step, delay=100_000)
            return loss(apply(q_params, batch))

    Args:
      params: a parameter pytree (e.g. Flax ``params``).
      bits: ``n``, an integer in [2, 16].
      step: the current training step, a Python int or an integer array (may be traced under ``jit``).
      delay: the first step that is fake-quantized (``0``: always), a non-negative Python int or an integer
        array.
      per_channel: one step per output channel (the last axis) instead of per tensor.

    Returns:
      ``params`` with every weight ``W`` replaced by :func:`fake_quantize` ``(W)`` if ``step >= delay``, else
      ``params`` unchanged (a ``lax.cond`` when ``step`` or ``delay`` is an array; decided in Python when both
      are Python ints). The gradient with respect to ``params`` is the identity in both cases (straight-through).

    Raises:
      ValueError: for bad ``bits``, a negative Python ``delay``, or a non-integer ``step`` / ``delay``.
    """
    bits = _check_bits(bits)
    for name, value in (("step", step), ("delay", delay)):
        if isinstance(value, bool) or not (
            isinstance(value, (int, np.integer))
            or (hasattr(value, "dtype") and jnp.issubdtype(value.dtype, jnp.integer) and jnp.ndim(value) == 0)
        ):
            raise ValueError(f"{name} must be an integer scalar (Python int or integer array), got {value!r}.")
    if isinstance(delay, (int, np.integer)) and delay < 0:
        raise ValueError(f"delay must be >= 0, got {delay}.")
    if isinstance(step, (int, np.integer)) and isinstance(delay, (int, np.integer)):
        return _fake_quantize_weights(params, bits, per_channel) if step >= delay else params
    return jax.lax.cond(
        jnp.asarray(step) >= jnp.asarray(delay),
        lambda p: _fake_quantize_weights(p, bits, per_channel),
        lambda p: p,
        params,
    )
