"""A multi-layer perceptron whose dtypes follow a precision policy."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import flax.linen as nn
import jax

from lpjax.nn.dense import Dense
from lpjax.precision import Policy, get_policy


class MLP(nn.Module):
    """``Dense -> activation`` for each hidden width, then a final ``Dense`` to ``output_dim``.

    Parameters are created in ``policy.param_dtype``; inputs are cast to ``policy.compute_dtype``; every layer is
    an :class:`lpjax.nn.Dense`, so the matmuls follow ``policy.matmul_dtype`` and ``impl``; the output is in the
    compute dtype (heads decide what leaves the network).

    Attributes:
      hidden_dims: widths of the hidden layers (the paper: two of 1024).
      output_dim: width of the output layer.
      policy: a :class:`lpjax.precision.Policy` or a name for :func:`lpjax.precision.get_policy`.
      activation: applied after each hidden layer: a name from :data:`lpjax.nn.dense.ACTIVATIONS` (fused into
        the kernel's epilogue when there is one) or any callable.
      impl: matmul implementation of every layer (``"xla"``, ``"pallas"`` or ``"reference"``).
    """

    hidden_dims: Sequence[int]
    output_dim: int
    policy: Policy | str = "fp32"
    activation: str | Callable[[jax.Array], jax.Array] = "relu"
    impl: str = "xla"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        policy = get_policy(self.policy)
        x = policy.cast_to_compute(x)
        for width in self.hidden_dims:
            if isinstance(self.activation, str):
                x = Dense(width, policy, self.impl, activation=self.activation)(x)
            else:
                x = self.activation(Dense(width, policy, self.impl)(x))
        return Dense(self.output_dim, policy, self.impl)(x)
