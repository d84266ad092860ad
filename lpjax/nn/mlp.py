"""A multi-layer perceptron whose dtypes follow a precision policy."""

from __future__ import annotations

from typing import Callable, Sequence

import flax.linen as nn
import jax

from lpjax.precision import Policy, get_policy


class MLP(nn.Module):
    """``Dense -> activation`` for each hidden width, then a final ``Dense`` to ``output_dim``.

    Parameters are created in ``policy.param_dtype``; inputs are cast to ``policy.compute_dtype`` and every
    matmul runs in it; the output is in the compute dtype (heads decide what leaves the network).

    Attributes:
      hidden_dims: widths of the hidden layers (the paper: two of 1024).
      output_dim: width of the output layer.
      policy: a :class:`lpjax.precision.Policy` or a name for :func:`lpjax.precision.get_policy`.
      activation: applied after each hidden layer.
    """

    hidden_dims: Sequence[int]
    output_dim: int
    policy: Policy | str = "fp32"
    activation: Callable[[jax.Array], jax.Array] = nn.relu

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        policy = get_policy(self.policy)
        x = policy.cast_to_compute(x)
        for width in self.hidden_dims:
            x = self.activation(nn.Dense(width, dtype=policy.compute_dtype, param_dtype=policy.param_dtype)(x))
        return nn.Dense(self.output_dim, dtype=policy.compute_dtype, param_dtype=policy.param_dtype)(x)
