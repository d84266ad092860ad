"""Actor and critic heads: SAC's (Yarats & Kostrikov's pytorch_sac architecture) and D4PG's."""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from lpjax.nn.mlp import MLP
from lpjax.precision import Policy


class TanhGaussianActor(nn.Module):
    """Outputs the mean and log standard deviation of a Gaussian that is squashed by ``tanh`` into [-1, 1].

    ``log_std = lo + (hi - lo) (tanh(x) + 1) / 2`` bounds the log-std smoothly to ``[lo, hi]`` (paper: [-5, 2]
    from states, [-10, 2] from pixels).

    Attributes:
      hidden_dims: MLP widths.
      action_dim: number of action dimensions.
      log_std_bounds: ``(lo, hi)``.
      policy: precision policy of the MLP; outputs are in its compute dtype.
      matmul_impl: matmul implementation of the MLP's layers (see :class:`lpjax.nn.Dense`).
      high_precision_ends: the MLP's first and last layers multiply in the compute dtype (see :class:`lpjax.nn.MLP`).
    """

    hidden_dims: Sequence[int]
    action_dim: int
    log_std_bounds: tuple[float, float] = (-5.0, 2.0)
    policy: Policy | str = "fp32"
    matmul_impl: str = "auto"
    high_precision_ends: bool = False

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        out = MLP(
            self.hidden_dims,
            2 * self.action_dim,
            self.policy,
            matmul_impl=self.matmul_impl,
            high_precision_ends=self.high_precision_ends,
        )(obs)
        mean, raw = jnp.split(out, 2, axis=-1)
        lo, hi = self.log_std_bounds
        log_std = lo + 0.5 * (hi - lo) * (jnp.tanh(raw) + 1.0)
        return mean, log_std.astype(mean.dtype)


class DoubleCritic(nn.Module):
    """Two independent Q-networks ``Q_i(s, a)`` on the concatenation of observation and action.

    Returns an array of shape ``(2, batch)`` (the two estimates), in the policy's compute dtype. ``matmul_impl`` and
    ``high_precision_ends`` are the MLPs' (see :class:`lpjax.nn.MLP`).
    """

    hidden_dims: Sequence[int]
    policy: Policy | str = "fp32"
    matmul_impl: str = "auto"
    high_precision_ends: bool = False

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array) -> jax.Array:
        x = jnp.concatenate([obs, action.astype(obs.dtype)], axis=-1)
        options = dict(matmul_impl=self.matmul_impl, high_precision_ends=self.high_precision_ends)
        return jnp.stack([MLP(self.hidden_dims, 1, self.policy, **options, name=n)(x)[..., 0] for n in ("q1", "q2")])


class DeterministicActor(nn.Module):
    """A deterministic policy ``mu(s) = tanh(MLP(s))`` in [-1, 1] (DDPG/D4PG; ActorQ: three hidden layers of 2048).

    The MLP shares this module's scope, so the parameters are exactly an :class:`lpjax.nn.MLP`'s,
    ``{"params": {"Dense_0": ..., ..., "Dense_L": ...}}``: an int8 actor runtime can load them as a plain MLP
    with a ``tanh`` output (:class:`lpjax.inference.Int8MLP`). Actions are in the policy's compute dtype.

    Attributes:
      hidden_dims: MLP widths.
      action_dim: number of action dimensions.
      policy: precision policy of the MLP.
      matmul_impl: matmul implementation of the MLP's layers (see :class:`lpjax.nn.Dense`).
      high_precision_ends: the MLP's first and last layers multiply in the compute dtype (see :class:`lpjax.nn.MLP`).
    """

    hidden_dims: Sequence[int]
    action_dim: int
    policy: Policy | str = "fp32"
    matmul_impl: str = "auto"
    high_precision_ends: bool = False

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        mlp = MLP(
            self.hidden_dims,
            self.action_dim,
            self.policy,
            matmul_impl=self.matmul_impl,
            high_precision_ends=self.high_precision_ends,
        )
        nn.share_scope(self, mlp)
        return jnp.tanh(mlp(obs))


class CategoricalCritic(nn.Module):
    """A distributional critic: logits of ``Z(s, a)`` over ``num_atoms`` fixed atoms (D4PG, Bellemare et al. 2017).

    One MLP on the concatenation of observation and action (as :class:`DoubleCritic`); returns ``(..., num_atoms)``
    logits in the policy's compute dtype. The atoms' values are the learner's business
    (:mod:`lpjax.agents.d4pg`). ``matmul_impl`` and ``high_precision_ends`` are the MLP's (see :class:`lpjax.nn.MLP`).
    """

    hidden_dims: Sequence[int]
    num_atoms: int
    policy: Policy | str = "fp32"
    matmul_impl: str = "auto"
    high_precision_ends: bool = False

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array) -> jax.Array:
        x = jnp.concatenate([obs, action.astype(obs.dtype)], axis=-1)
        return MLP(
            self.hidden_dims,
            self.num_atoms,
            self.policy,
            matmul_impl=self.matmul_impl,
            high_precision_ends=self.high_precision_ends,
        )(x)
