"""hAdam: Adam that stores ``w = sqrt(v)`` and updates it with ``hypot`` (Björck et al., 2021, Sec. 4.1).

Adam's second moment ``v <- b2 v + (1 - b2) g^2`` squares the gradient: in float16 ``g^2`` overflows for
``|g| > 256`` and underflows to zero for ``|g| < 2.4e-4`` (and the smallest subnormal is 6e-8). hAdam keeps the
square root instead,

    m <- b1 m + (1 - b1) g
    w <- hypot(sqrt(b2) w, sqrt(1 - b2) g)                    (= sqrt(b2 w^2 + (1 - b2) g^2))
    u  = -lr * m_hat / (w_hat + eps),  m_hat = m / (1 - b1^t),  w_hat = w / sqrt(1 - b2^t)

and by induction ``w_t = sqrt(v_t)``, so the update is Adam's exactly in exact arithmetic, while every
stored quantity stays within a few binades of ``|g|``.

Two implementation choices, both the identity in exact arithmetic:

* ``w`` is evaluated in float32 and rounded once to its storage dtype. For float16 storage the squares of the
  (scaled) operands cannot leave float32's range (``65504^2 = 4.3e9``, ``(6e-8)^2 = 3.6e-15``), so the plain
  ``sqrt(a^2 + b^2)`` is used, as PyTorch's half-precision kernels compute in float; for wider dtypes (bfloat16,
  float32, float64) the overflow-free ``hypot`` is used in the promoted dtype.
* Where ``w_hat + eps`` is 0 (``eps`` rounded to 0 in the moments' dtype and ``w`` underflowed), the update is
  0, its exact-arithmetic value when ``w = 0`` (all past gradients zero), instead of ``0 / 0 = nan``.
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
    """Adam's ``eps`` rounds to zero in the moments' dtype: tiny second moments are not damped."""


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
            f"hAdam eps={eps:g} rounds to 0 in {', '.join(lost)}: updates of parameters with tiny gradients are "
            "undamped (about lr * sign(g)) and entries whose w underflows get no update. Wrap the optimizer in lpjax.optim.compound_loss_scaling (which scales eps with the loss scale) or "
            "raise eps.", EpsUnderflowWarning, stacklevel=3)


def _squares_fit(storage, compute) -> bool:
    """Whether squares of every finite ``storage`` value stay normal and finite in ``compute``."""
    storage, compute = jnp.finfo(storage), jnp.finfo(compute)
    if storage.bits >= compute.bits:
        return False
    return (float(storage.max) ** 2 < float(compute.max)
            and float(storage.smallest_subnormal) ** 2 > float(compute.smallest_normal))


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
        # Two separate trees: a state whose moments share buffers cannot be donated to a jitted step.
        return ScaleByHAdamState(count=jnp.zeros([], jnp.int32), mu=jax.tree.map(jnp.zeros_like, params),
                                 nu_sqrt=jax.tree.map(jnp.zeros_like, params),
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
            dtype = jnp.promote_types(w.dtype, jnp.float32)
            b2_ = jnp.asarray(b2, dtype)
            a = jnp.sqrt(b2_) * w.astype(dtype)
            b = jnp.sqrt(1 - b2_) * g.astype(dtype)
            root = jnp.sqrt(a * a + b * b) if _squares_fit(w.dtype, dtype) else jnp.hypot(a, b)
            return root.astype(w.dtype)

        mu = jax.tree.map(first_moment, updates, state.mu)
        nu_sqrt = jax.tree.map(root_second_moment, updates, state.nu_sqrt)
        def direction(m, w):
            # Bias corrections in float32 (float64 for float64 moments), cast to the moments' dtype.
            dtype = jnp.promote_types(m.dtype, jnp.float32)
            t = count.astype(dtype)
            mu_correction = (1 - jnp.power(jnp.asarray(b1, dtype), t)).astype(m.dtype)
            nu_correction = jnp.sqrt(1 - jnp.power(jnp.asarray(b2, dtype), t)).astype(w.dtype)
            scaled_eps = (eps * state.eps_scale.astype(dtype)).astype(w.dtype)
            denominator = w / nu_correction + scaled_eps
            safe = jnp.where(denominator == 0, jnp.ones_like(denominator), denominator)
            return jnp.where(denominator == 0, jnp.zeros_like(m), (m / mu_correction) / safe)

        updates = jax.tree.map(direction, mu, nu_sqrt)
        return updates, ScaleByHAdamState(count=count, mu=mu, nu_sqrt=nu_sqrt, eps_scale=state.eps_scale)

    return optax.GradientTransformation(init_fn, update_fn)


def hadam(learning_rate: optax.ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
          eps: float = 1e-8) -> optax.GradientTransformation:
    """The hAdam optimizer: :func:`scale_by_hadam` followed by ``-learning_rate`` (a float or an optax schedule).

    A drop-in replacement for ``optax.adam(learning_rate, b1, b2, eps)``: identical updates in exact arithmetic.
    """
    return optax.chain(scale_by_hadam(b1=b1, b2=b2, eps=eps), optax.scale_by_learning_rate(learning_rate))
