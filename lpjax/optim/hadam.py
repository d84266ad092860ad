"""hAdam: Adam that stores ``w = sqrt(v)`` and updates it with ``hypot`` (Björck et al., 2021, Sec. 4.1).

Adam's second moment ``v <- b2 v + (1 - b2) g^2`` squares the gradient: in float16 ``g^2`` overflows for
``|g| > 256`` and underflows to zero for ``|g| < 2.4e-4`` (and the smallest subnormal is 6e-8). hAdam keeps the
square root instead,

    m <- b1 m + (1 - b1) g
    w <- hypot(sqrt(b2) w, sqrt(1 - b2) g)                    (= sqrt(b2 w^2 + (1 - b2) g^2))
    u  = -lr * m_hat / (w_hat + eps),  m_hat = m / (1 - b1^t),  w_hat = w / sqrt(1 - b2^t)

and by induction ``w_t = sqrt(v_t)``, so the update is Adam's exactly in exact arithmetic, while every
intermediate stays within a few binades of ``|g|``.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax


class EpsUnderflowWarning(UserWarning):
    """Adam's ``eps`` rounds to zero in the moments' dtype, so an all-zero gradient gives ``0 / 0 = nan``."""


class ScaleByHAdamState(NamedTuple):
    """State of :func:`scale_by_hadam`.

    Attributes:
      count: int32 step counter ``t`` used for bias correction.
      mu: first moment ``m``, same structure and dtype as the parameters.
      nu_sqrt: ``w = sqrt(v)``, the square root of Adam's second moment.
      eps_scale: float32 multiplier of ``eps``. 1 unless a loss scaler owns this state:
        :func:`lpjax.optim.compound_loss_scaling` keeps it equal to the loss scale, so ``eps`` lives in the same
        scaled units as ``mu`` and ``nu_sqrt``.
    """

    count: chex.Array
    mu: optax.Updates
    nu_sqrt: optax.Updates
    eps_scale: chex.Array


def _warn_if_eps_underflows(eps, params: optax.Params) -> None:
    if not isinstance(eps, (int, float)):  # a traced hyperparameter (optax.inject_hyperparams): nothing to check
        return
    dtypes = {np.dtype(leaf.dtype) for leaf in jax.tree.leaves(params) if jnp.issubdtype(leaf.dtype, jnp.floating)}
    lost = sorted(d.name for d in dtypes if eps > 0 and np.asarray(eps, d) == 0)
    if lost:
        warnings.warn(
            f"hAdam eps={eps:g} rounds to 0 in {', '.join(lost)}: an all-zero gradient entry gives 0/0 = nan. "
            "Wrap the optimizer in lpjax.optim.compound_loss_scaling (which scales eps with the loss scale) or "
            "raise eps.", EpsUnderflowWarning, stacklevel=3)


def scale_by_hadam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> optax.GradientTransformation:
    """Rescales updates by hAdam's ``m_hat / (w_hat + eps)`` (no learning rate, no sign flip).

    Moments are kept in the dtype of the parameters; the bias corrections ``1 - b1^t`` and ``sqrt(1 - b2^t)``
    are computed in float32 (float64 for float64 moments) and cast to the moments' dtype.

    Args:
      b1: decay of the first moment.
      b2: decay of the second moment (``w`` decays with ``sqrt(b2)``).
      eps: term added to ``w_hat`` in the denominator, multiplied by ``state.eps_scale``.

    Returns:
      An ``optax.GradientTransformation`` with state :class:`ScaleByHAdamState`.
    """
    def init_fn(params):
        _warn_if_eps_underflows(eps, params)
        zeros = jax.tree.map(jnp.zeros_like, params)
        return ScaleByHAdamState(count=jnp.zeros([], jnp.int32), mu=zeros, nu_sqrt=zeros,
                                 eps_scale=jnp.ones([], jnp.float32))

    def update_fn(updates, state, params=None):
        del params
        count = optax.safe_increment(state.count)
        # Coefficients are cast to each moment's dtype (they may be traced float32 hyperparameters) so float16
        # moments are not promoted.
        def first_moment(g, m):
            decay = jnp.asarray(b1, m.dtype)
            return decay * m + (1 - decay) * g.astype(m.dtype)

        def root_second_moment(g, w):
            root_b2 = jnp.sqrt(jnp.asarray(b2, jnp.promote_types(w.dtype, jnp.float32)))
            return jnp.hypot(root_b2.astype(w.dtype) * w,
                             jnp.sqrt(1 - root_b2 * root_b2).astype(w.dtype) * g.astype(w.dtype))

        mu = jax.tree.map(first_moment, updates, state.mu)
        nu_sqrt = jax.tree.map(root_second_moment, updates, state.nu_sqrt)
        def direction(m, w):
            # Bias corrections in float32 (float64 for float64 moments), cast to the moments' dtype.
            dtype = jnp.promote_types(m.dtype, jnp.float32)
            t = count.astype(dtype)
            mu_correction = (1 - jnp.power(jnp.asarray(b1, dtype), t)).astype(m.dtype)
            nu_correction = jnp.sqrt(1 - jnp.power(jnp.asarray(b2, dtype), t)).astype(w.dtype)
            scaled_eps = (eps * state.eps_scale.astype(dtype)).astype(w.dtype)
            return (m / mu_correction) / (w / nu_correction + scaled_eps)

        updates = jax.tree.map(direction, mu, nu_sqrt)
        return updates, ScaleByHAdamState(count=count, mu=mu, nu_sqrt=nu_sqrt, eps_scale=state.eps_scale)

    return optax.GradientTransformation(init_fn, update_fn)


def hadam(learning_rate: optax.ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
          eps: float = 1e-8) -> optax.GradientTransformation:
    """The hAdam optimizer: :func:`scale_by_hadam` followed by ``-learning_rate`` (a float or an optax schedule).

    A drop-in replacement for ``optax.adam(learning_rate, b1, b2, eps)``: identical updates in exact arithmetic.
    """
    return optax.chain(scale_by_hadam(b1=b1, b2=b2, eps=eps), optax.scale_by_learning_rate(learning_rate))
