"""A dense layer whose matmul implementation follows the precision policy: XLA, or one of lpjax's kernels.

:func:`policy_dense` computes ``y = act(x @ kernel + bias)`` and picks the implementation from
``policy.matmul_dtype`` and ``matmul_impl``:

==================  =====================  ========================================================
``matmul_dtype``    ``"xla"``               ``"pallas"`` / ``"reference"``
==================  =====================  ========================================================
float32 / float64   ``lax.dot_general`` in  (no kernel: ``ValueError``)
                    ``compute_dtype``
float16 / bfloat16  ``lax.dot_general`` in  :func:`lpjax.kernels.fp16_matmul`: fp16/bf16 operands, fp32
                    ``compute_dtype``       accumulation, bias and activation fused in the epilogue
float8_e4m3fn       the jnp reference of    :func:`lpjax.kernels.fp8_blockwise_matmul`: 128x128 weight
                    the fp8 GEMM            blocks, 1x128 activation groups, fp32 promotion per slice
==================  =====================  ========================================================

``matmul_impl="auto"`` (the default) picks ``"xla"`` or ``"pallas"`` per device, matmul dtype and GEMM shape from the
GPU measurements of :mod:`lpjax.nn.matmul_choice`: ``"xla"`` on a CPU or TPU, for float32 and on GPUs nobody
measured; on Hopper ``"xla"`` for float16/bfloat16 (XLA's dot is faster at every measured shape) and ``"pallas"``
for fp8 (the kernel is faster than the GEMM's XLA reference).

``matmul_impl="xla"`` with a float16/bfloat16/float32 matmul is exactly what ``flax.linen.Dense(dtype=compute_dtype)``
computes, so swapping Flax's layer for :class:`Dense` changes nothing until a kernel is asked for (or ``"auto"``
picks one: fp8 on a Hopper GPU). On a CPU, ``"pallas"`` runs in Pallas' interpret mode (slow; for tests). Outputs
are in ``policy.compute_dtype``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from lpjax.kernels import fp8_blockwise_matmul, fp16_matmul
from lpjax.nn.matmul_choice import AUTO, resolve_matmul_impl
from lpjax.precision import Policy, get_policy

MATMUL_IMPLS = (AUTO, "xla", "pallas", "reference")
"""Valid matmul implementations of :class:`Dense` (``"auto"``: :func:`lpjax.nn.matmul_choice.resolve_matmul_impl`)."""


@jax.custom_vjp
def relu(x: jax.Array) -> jax.Array:
    """``max(x, 0)``, whose backward pass keeps only its output: ``dx = dy * (y > 0)``.

    ``jax.nn.relu`` keeps a boolean mask ``x > 0`` and a broadcast zero as large as the activation for its
    backward pass. Here the only residual is the output ``y``, which the next layer's matmul keeps anyway as its
    input, so the activation adds nothing to the memory a backward pass holds. ``y > 0`` iff ``x > 0``, so the
    gradient is ``jax.nn.relu``'s (0 at ``x = 0``).
    """
    return jnp.maximum(x, jnp.zeros([], x.dtype))


def _relu_forward(x):
    y = relu(x)
    return y, y


def _relu_backward(y, dy):
    return (jnp.where(y > 0, dy, jnp.zeros([], dy.dtype)),)


relu.defvjp(_relu_forward, _relu_backward)


ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "none": lambda x: x,
    "relu": relu,
    "elu": jax.nn.elu,
    "tanh": jnp.tanh,
}
"""Activations the fused epilogues support, by name."""

_FULL = (np.dtype(jnp.float64), np.dtype(jnp.float32))
_HALF = (np.dtype(jnp.float16), np.dtype(jnp.bfloat16))
_FP8 = np.dtype(jnp.float8_e4m3fn)


def check_dense_options(policy: Policy, matmul_impl: str, activation: str) -> None:
    """Raises a ``ValueError`` for an unknown ``matmul_impl``/``activation`` or a kernel that does not exist.

    Called by configs before any compute, and by :func:`policy_dense`.
    """
    if matmul_impl not in MATMUL_IMPLS:
        raise ValueError(f"matmul_impl must be one of {MATMUL_IMPLS}, got {matmul_impl!r}.")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {tuple(ACTIVATIONS)}, got {activation!r}.")
    matmul = policy.matmul_dtype
    if matmul not in _FULL + _HALF + (_FP8,):
        raise ValueError(
            f"No dense matmul for matmul_dtype={matmul.name}; use float64, float32, float16, bfloat16 or float8_e4m3fn."
        )
    if matmul_impl not in (AUTO, "xla") and matmul not in _HALF + (_FP8,):
        raise ValueError(
            f"matmul_impl={matmul_impl!r} selects a low-precision kernel, but the policy's matmul dtype is "
            f"{matmul.name}; kernels exist for float16, bfloat16 and float8_e4m3fn. Use matmul_impl='xla'."
        )


def policy_dense(
    x: jax.Array,
    kernel: jax.Array,
    bias: jax.Array | None,
    *,
    policy: Policy | str,
    matmul_impl: str = AUTO,
    activation: str = "none",
) -> jax.Array:
    """``act(x @ kernel + bias)`` with the matmul implementation chosen by ``policy`` and ``matmul_impl``.

    Args:
      x: inputs ``(..., K)``; leading axes are flattened for the kernels and restored.
      kernel: weights ``(K, N)`` in any float dtype (the parameter dtype).
      bias: ``(N,)`` or ``None``.
      policy: precision policy; its ``matmul_dtype`` picks the GEMM, its ``compute_dtype`` the output dtype.
      matmul_impl: ``"auto"``, ``"xla"``, ``"pallas"`` or ``"reference"`` (see the module docstring).
      activation: ``"none"``, ``"relu"``, ``"elu"`` or ``"tanh"``; fused into the fp16 kernel's epilogue.

    Returns:
      ``(..., N)`` in ``policy.compute_dtype``.
    """
    policy = get_policy(policy)
    check_dense_options(policy, matmul_impl, activation)
    compute, matmul = policy.compute_dtype, policy.matmul_dtype
    impl = resolve_matmul_impl(matmul_impl, matmul, (math.prod(x.shape[:-1]) or 1, kernel.shape[0], kernel.shape[1]))
    if matmul == _FP8:
        y = _flat(
            x,
            lambda x2: fp8_blockwise_matmul(
                x2.astype(compute), kernel, bias=bias, out_dtype=compute, impl="reference" if impl == "xla" else impl
            ),
        )
        return ACTIVATIONS[activation](y)
    if impl != "xla":
        return _flat(
            x,
            lambda x2: fp16_matmul(
                x2.astype(matmul), kernel.astype(matmul), bias, activation=activation, out_dtype=compute, impl=impl
            ),
        )
    x, kernel = x.astype(compute), kernel.astype(compute)
    y = jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))
    if bias is not None:
        y = y + jnp.reshape(bias.astype(compute), (1,) * (y.ndim - 1) + (-1,))
    return ACTIVATIONS[activation](y)


def _flat(x: jax.Array, matmul: Callable[[jax.Array], jax.Array]) -> jax.Array:
    """Applies a matrix-only ``matmul`` to ``x`` of shape ``(..., K)`` by flattening the leading axes."""
    y = matmul(x.reshape(-1, x.shape[-1]))
    return y.reshape(x.shape[:-1] + y.shape[-1:])


class Dense(nn.Module):
    """``flax.linen.Dense`` with a policy-driven matmul (see :func:`policy_dense`) and an optional fused activation.

    Parameters are named ``kernel`` ``(K, N)`` and ``bias`` ``(N,)`` as in Flax and stored in
    ``policy.param_dtype``, so parameter trees and checkpoints are interchangeable with ``flax.linen.Dense``.

    Attributes:
      features: output width ``N``.
      policy: a :class:`lpjax.precision.Policy` or a name for :func:`lpjax.precision.get_policy`.
      matmul_impl: ``"auto"`` (default: the implementation measured fastest for this device, dtype and shape;
        ``"xla"`` on a CPU), ``"xla"``, ``"pallas"`` or ``"reference"``.
      activation: ``"none"``, ``"relu"``, ``"elu"`` or ``"tanh"``.
      use_bias: whether to add a bias.
      kernel_init, bias_init: initializers (Flax's defaults).
    """

    features: int
    policy: Policy | str = "fp32"
    matmul_impl: str = AUTO
    activation: str = "none"
    use_bias: bool = True
    kernel_init: Callable[..., Any] = nn.initializers.lecun_normal()
    bias_init: Callable[..., Any] = nn.initializers.zeros_init()

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        policy = get_policy(self.policy)
        kernel = self.param("kernel", self.kernel_init, (x.shape[-1], self.features), policy.param_dtype)
        bias = self.param("bias", self.bias_init, (self.features,), policy.param_dtype) if self.use_bias else None
        return policy_dense(x, kernel, bias, policy=policy, matmul_impl=self.matmul_impl, activation=self.activation)
