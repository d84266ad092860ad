"""The float32 baseline of the actor's policy: one ``jax.jit``-compiled forward with :class:`Int8MLP`'s interface."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lpjax.inference.mlp_params import check_chain, check_output_activation, mlp_layers, obs_batch


@functools.partial(jax.jit, static_argnums=(2,))
def _fp32_forward(layers, x, output_activation):
    for i, (kernel, bias) in enumerate(layers):
        x = jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))
        if bias is not None:
            x = x + bias
        if i < len(layers) - 1:
            x = jax.nn.relu(x)
    return jnp.tanh(x) if output_activation == "tanh" else x


class Fp32MLP:
    """The float32 baseline with :class:`lpjax.inference.Int8MLP`'s interface: one ``jax.jit``-compiled forward on
    the default device.

    Computes what :class:`lpjax.nn.MLP` (fp32 policy, relu) computes, followed by ``output_activation``. JAX's
    threading is fixed when jax is imported (``XLA_FLAGS``), so unlike :class:`Int8MLP` there is no ``threads``
    argument: for single-threaded actors start the process with
    ``XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"``.

    Attributes:
      output_activation, in_dim, out_dim: as in :class:`Int8MLP`.
      nbytes: bytes of the float32 kernels and biases.
    """

    def __init__(self, layers: Sequence[tuple[Any, Any]], output_activation: str = "tanh"):
        """Prefer :meth:`from_params`; ``layers`` is a sequence of ``(kernel (K, N), bias (N,) or None)``."""
        self.output_activation = check_output_activation(output_activation)
        layers = [(np.asarray(k), None if b is None else np.asarray(b)) for k, b in layers]
        if not layers:
            raise ValueError("layers is empty; an MLP needs at least one layer.")
        check_chain([k.shape for k, _ in layers])
        self._layers = tuple(
            (jnp.asarray(k, jnp.float32), None if b is None else jnp.asarray(b, jnp.float32)) for k, b in layers
        )
        self.in_dim = int(layers[0][0].shape[0])
        self.out_dim = int(layers[-1][0].shape[1])
        self.nbytes = int(sum(k.nbytes + (0 if b is None else b.nbytes) for k, b in self._layers))

    @classmethod
    def from_params(cls, params: Mapping[str, Any], output_activation: str = "tanh") -> Fp32MLP:
        """From an :class:`lpjax.nn.MLP` parameter tree (see :func:`lpjax.inference.mlp_layers`), cast to float32."""
        return cls(mlp_layers(params), output_activation)

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        """Actions for ``obs`` ``(in_dim,)`` or ``(B, in_dim)``: float32 ``(out_dim,)`` or ``(B, out_dim)``."""
        y = np.asarray(_fp32_forward(self._layers, obs_batch(obs, self.in_dim), self.output_activation))
        return y[0] if np.ndim(obs) == 1 else y

    def __repr__(self) -> str:
        sizes = [self.in_dim] + [k.shape[1] for k, _ in self._layers]
        return f"Fp32MLP(sizes={sizes}, output_activation={self.output_activation!r})"
