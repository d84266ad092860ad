"""``low_precision_adam``: Adam with each of the paper's optimizer methods as a switch.

One factory for every row of the ablations of Björck et al. (2021): plain Adam (the naive baseline), hAdam,
compound loss scaling and Kahan-gradients, in any combination.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from lpjax.optim.hadam import hadam as _hadam
from lpjax.optim.kahan import kahan_summation
from lpjax.optim.loss_scaling import compound_loss_scaling


def low_precision_adam(learning_rate: optax.ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
                       eps: float = 1e-8, *, hadam: bool = True, loss_scaling: bool = True, kahan: bool = True,
                       init_scale: float = 1e4, growth_interval: int = 10_000) -> optax.GradientTransformation:
    """Adam, optionally with hAdam, compound loss scaling and Kahan-compensated parameter updates.

    Args:
      learning_rate: float or optax schedule.
      b1, b2, eps: Adam's hyper-parameters.
      hadam: use :func:`lpjax.optim.hadam` (else ``optax.adam``).
      loss_scaling: wrap in :func:`lpjax.optim.compound_loss_scaling`; the caller multiplies its loss by
        :func:`lpjax.optim.loss_scale` of the state (1 when this is off: :func:`loss_scale_or_one`).
      kahan: end the chain with :func:`lpjax.optim.kahan_summation` (apply with ``optax.apply_updates``).
      init_scale, growth_interval: of the loss scaler.

    With all switches off this is exactly ``optax.adam`` (chained with nothing).
    """
    if hadam:
        inner = _hadam(learning_rate, b1=b1, b2=b2, eps=eps)
    elif loss_scaling:  # optax's Adam must expose eps, in the widest float available, for the scaler to scale it
        widest = jax.dtypes.canonicalize_dtype(jnp.float64)  # float32 unless float64 is enabled
        inner = optax.inject_hyperparams(optax.adam, hyperparam_dtype=widest)(
            learning_rate=learning_rate, b1=b1, b2=b2, eps=eps)
    else:
        inner = optax.adam(learning_rate, b1=b1, b2=b2, eps=eps)
    if loss_scaling:
        inner = compound_loss_scaling(inner, init_scale=init_scale, growth_interval=growth_interval)
    return optax.chain(inner, kahan_summation()) if kahan else inner
