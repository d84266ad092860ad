"""A multi-layer perceptron whose dtypes follow a precision policy."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import flax.linen as nn
import jax

from lpjax.nn.dense import Dense
from lpjax.precision import Policy, get_policy


class MLP(nn.Module):
    """``Dense -> activation`` for each hidden width, then a final ``Dense`` to ``output_dim``.

    Parameters are created in ``policy.param_dtype``; inputs are cast to ``policy.compute_dtype``; every layer is
    an :class:`lpjax.nn.Dense`, so the matmuls follow ``policy.matmul_dtype`` and ``matmul_impl``; the output is in the
    compute dtype (heads decide what leaves the network).

    Attributes:
      hidden_dims: widths of the hidden layers (the paper: two of 1024).
      output_dim: width of the output layer.
      policy: a :class:`lpjax.precision.Policy` or a name for :func:`lpjax.precision.get_policy`.
      activation: applied after each hidden layer: a name from :data:`lpjax.nn.dense.ACTIVATIONS` (fused into
        the kernel's epilogue when there is one) or any callable.
      matmul_impl: matmul implementation of every layer (``"auto"``, ``"xla"``, ``"pallas"`` or ``"reference"``).
      high_precision_ends: the first and the last layer multiply in ``policy.compute_dtype`` instead of
        ``policy.matmul_dtype``, as FP8 recipes keep the embedding and the output head in high precision; only the
        layers between them take the low-precision GEMM. Changes nothing when the two dtypes are equal, and the
        parameters are the same either way.
    """

    hidden_dims: Sequence[int]
    output_dim: int
    policy: Policy | str = "fp32"
    activation: str | Callable[[jax.Array], jax.Array] = "relu"
    matmul_impl: str = "auto"
    high_precision_ends: bool = False

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        policy = get_policy(self.policy)
        end_policy, end_impl = policy, self.matmul_impl
        if self.high_precision_ends and policy.matmul_dtype != policy.compute_dtype:
            end_policy = dataclasses.replace(policy, matmul_dtype=policy.compute_dtype)
            end_impl = self.matmul_impl if policy.compute_dtype.itemsize == 2 else "xla"  # kernels are 16-bit or fp8
        x = policy.cast_to_compute(x)
        for index, width in enumerate(self.hidden_dims):
            layer = (end_policy, end_impl) if index == 0 else (policy, self.matmul_impl)
            if isinstance(self.activation, str):
                x = Dense(width, *layer, activation=self.activation)(x)
            else:
                x = self.activation(Dense(width, *layer)(x))
        return Dense(self.output_dim, end_policy, end_impl)(x)
