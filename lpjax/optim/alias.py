"""Factories: ``method_optimizer`` (the learners' optimizer, built from a :class:`lpjax.methods.PrecisionMethods`),
``low_precision_adam`` (the same with the methods as keyword switches) and ``inject_hyperparams`` (optax's, with
float32 hyperparameters).

They build every row of the ablations of Björck et al. (2021): plain Adam (the naive baseline), hAdam, compound
loss scaling and Kahan-gradients, in any combination.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lpjax.methods import PrecisionMethods
from lpjax.optim._hyperparameters import require_wide
from lpjax.optim.hadam import descend, scale_by_hadam
from lpjax.optim.hadam import hadam as _hadam
from lpjax.optim.kahan import kahan_summation
from lpjax.optim.loss_scaling import compound_loss_scaling
from lpjax.optim.quantized_moments import is_quantized_dtype
from lpjax.optim.stochastic_rounding import stochastic_rounding

_STATIC_ARGUMENTS = ("moment_dtype", "compensation_dtype", "moment_block_size")


def inject_hyperparams(
    inner_factory: Callable[..., optax.GradientTransformation],
    static_args: str | Iterable[str] = (),
    hyperparam_dtype: Any = jnp.float32,
) -> Callable[..., optax.GradientTransformationExtraArgs]:
    """``optax.inject_hyperparams`` with float32 hyperparameters, whatever the parameters' dtype.

    optax stores injected hyperparameters in the parameters' dtype by default, where a float16 ``eps=1e-8`` is 0
    and ``init_scale=2**16`` is inf. This wrapper stores them in ``hyperparam_dtype`` (float32), and treats the
    dtype arguments of lpjax's factories (``moment_dtype``, ``compensation_dtype``) as static, since optax would
    take a dtype such as ``jnp.float32`` (a callable) for a schedule, and ``moment_block_size``, which shapes the
    state.

    Example::

        tx = lpjax.optim.inject_hyperparams(lpjax.optim.low_precision_adam)(learning_rate=1e-4)
        opt_state = tx.init(params)                   # float16 params, float32 hyperparameters
        opt_state.hyperparams["learning_rate"] = 3e-5  # change it between steps
    """
    static = {static_args} if isinstance(static_args, str) else set(static_args)
    static |= set(_STATIC_ARGUMENTS) & set(inspect.signature(inner_factory).parameters)
    return optax.inject_hyperparams(inner_factory, static_args=tuple(sorted(static)), hyperparam_dtype=hyperparam_dtype)


def method_optimizer(
    learning_rate: optax.ScalarOrSchedule,
    methods: PrecisionMethods,
    *,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    max_grad_norm: float | None = None,
    rounding_seed: int = 0,
) -> optax.GradientTransformation:
    """The optimizer of a learner's network: Adam (or AdamW) with ``methods``' optimizer switches.

    The chain, each part present only when its switch or argument asks for it::

        compound_loss_scaling(                                       methods.loss_scaling
            chain(clip_by_global_norm(max_grad_norm),                max_grad_norm
                  hadam | adam (b1, b2, eps, moment_dtype),          methods.hadam (8-bit moments: hadam)
                  add_decayed_weights(weight_decay) * -lr))          weight_decay (AdamW's decoupled decay)
        then kahan_summation()                                       methods.kahan_gradients
          or else stochastic_rounding(rounding_seed)                 methods.stochastic_rounding

    With loss scaling and clipping, the scaler gives the clip the true (unscaled) gradients; without clipping,
    hAdam (or the injected Adam) receives the scaled gradients and the scaler takes the paper's compound path
    (see :func:`lpjax.optim.compound_loss_scaling`). With every switch off and no clipping or decay it is exactly
    ``optax.adam(learning_rate, b1, b2, eps)``. ``rounding_seed`` seeds the stochastic rounding's key (give each
    network of a learner its own).
    """
    require_wide("method_optimizer", "learning_rate", learning_rate)
    moment_dtype = methods.moment_numpy_dtype
    if is_quantized_dtype(moment_dtype) and not methods.hadam:
        raise ValueError(
            f"PrecisionMethods: moment_dtype={methods.moment_dtype!r} (8-bit, blockwise) needs hadam=True."
        )
    block = methods.moment_block_size
    if weight_decay:
        if methods.hadam:  # the compound path: scale_by_hadam first, the learning rate applied in float32
            inner = optax.chain(
                scale_by_hadam(b1, b2, eps, moment_dtype, block),
                optax.add_decayed_weights(weight_decay),
                descend(learning_rate),
            )
        else:
            inner = optax.adamw(learning_rate, b1, b2, eps, mu_dtype=moment_dtype, weight_decay=weight_decay)
    elif methods.hadam:
        inner = _hadam(learning_rate, b1=b1, b2=b2, eps=eps, moment_dtype=moment_dtype, moment_block_size=block)
    elif methods.loss_scaling:  # optax's Adam must expose eps, in the widest float available, for the scaler
        widest = jax.dtypes.canonicalize_dtype(jnp.float64)  # float32 unless float64 is enabled
        inner = optax.inject_hyperparams(optax.adam, static_args="mu_dtype", hyperparam_dtype=widest)(
            learning_rate=learning_rate, b1=b1, b2=b2, eps=eps, mu_dtype=moment_dtype
        )
    else:
        inner = optax.adam(learning_rate, b1=b1, b2=b2, eps=eps, mu_dtype=moment_dtype)
    if max_grad_norm is not None:
        inner = optax.chain(optax.clip_by_global_norm(max_grad_norm), inner)
    if methods.loss_scaling:
        inner = compound_loss_scaling(inner, init_scale=methods.init_scale, growth_interval=methods.growth_interval)
    if methods.kahan_gradients:
        return optax.chain(inner, kahan_summation())
    if methods.stochastic_rounding:
        return optax.chain(inner, stochastic_rounding(rounding_seed))
    return inner


def low_precision_adam(
    learning_rate: optax.ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    *,
    hadam: bool = True,
    loss_scaling: bool = True,
    kahan: bool = True,
    init_scale: float = 1e4,
    growth_interval: int = 10_000,
    moment_dtype: Any = None,
) -> optax.GradientTransformation:
    """Adam, optionally with hAdam, compound loss scaling and Kahan-compensated parameter updates.

    Args:
      learning_rate: float or optax schedule.
      b1, b2, eps: Adam's hyper-parameters.
      hadam: use :func:`lpjax.optim.hadam` (else ``optax.adam``).
      loss_scaling: wrap in :func:`lpjax.optim.compound_loss_scaling`; the caller multiplies its loss by
        :func:`lpjax.optim.loss_scale` of the state (1 when this is off: :func:`loss_scale_or_one`), or uses
        :func:`lpjax.optim.scaled_value_and_grad`.
      kahan: end the chain with :func:`lpjax.optim.kahan_summation` (apply with ``optax.apply_updates``).
      init_scale, growth_interval: of the loss scaler.
      moment_dtype: dtype of hAdam's moments (``None``: the parameters'); also optax Adam's ``mu_dtype``.

    :func:`method_optimizer` with ``PrecisionMethods(hadam=hadam, loss_scaling=loss_scaling,
    kahan_gradients=kahan, ...)``. With all switches off this is exactly ``optax.adam`` (chained with nothing).
    Every numeric argument may be injected:
    ``lpjax.optim.inject_hyperparams(low_precision_adam)(learning_rate=1e-4)``.
    """
    require_wide("low_precision_adam", "learning_rate", learning_rate)
    methods = PrecisionMethods(
        hadam=hadam,
        loss_scaling=loss_scaling,
        kahan_gradients=kahan,
        init_scale=init_scale,
        growth_interval=growth_interval,
        moment_dtype=None if moment_dtype is None else np.dtype(moment_dtype).name,
    )
    return method_optimizer(learning_rate, methods, b1=b1, b2=b2, eps=eps)
