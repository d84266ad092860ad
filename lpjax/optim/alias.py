"""Factories: ``low_precision_adam`` (Adam with the low-precision methods as keyword switches) and
``inject_hyperparams`` (optax's, with float32 hyperparameters).

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

from lpjax.optim._hyperparameters import require_wide
from lpjax.optim.hadam import descend, scale_by_hadam
from lpjax.optim.hadam import hadam as _hadam
from lpjax.optim.kahan import kahan_summation
from lpjax.optim.loss_scaling import compound_loss_scaling
from lpjax.optim.quantized_moments import DEFAULT_BLOCK_SIZE, is_quantized_dtype
from lpjax.optim.stochastic_rounding import stochastic_rounding as stochastic_rounding_transform

_STATIC_ARGUMENTS = (
    "moment_dtype",
    "compensation_dtype",
    "moment_block_size",
    "weight_decay",
    "max_grad_norm",
    "rounding_seed",
)


def inject_hyperparams(
    inner_factory: Callable[..., optax.GradientTransformation],
    static_args: str | Iterable[str] = (),
    hyperparam_dtype: Any = jnp.float32,
) -> Callable[..., optax.GradientTransformationExtraArgs]:
    """``optax.inject_hyperparams`` with float32 hyperparameters, whatever the parameters' dtype.

    optax stores injected hyperparameters in the parameters' dtype by default, where a float16 ``eps=1e-8`` is 0
    and ``init_scale=2**16`` is inf. This wrapper stores them in ``hyperparam_dtype`` (float32), and treats the
    dtype arguments of lpjax's factories (``moment_dtype``, ``compensation_dtype``) as static, since optax would
    take a dtype such as ``jnp.float32`` (a callable) for a schedule, and the arguments that shape the chain or
    its state (``moment_block_size``, ``weight_decay``, ``max_grad_norm``, ``rounding_seed``).

    Example::

        tx = lpjax.optim.inject_hyperparams(lpjax.optim.low_precision_adam)(learning_rate=1e-4)
        opt_state = tx.init(params)                   # float16 params, float32 hyperparameters
        opt_state.hyperparams["learning_rate"] = 3e-5  # change it between steps
    """
    static = {static_args} if isinstance(static_args, str) else set(static_args)
    static |= set(_STATIC_ARGUMENTS) & set(inspect.signature(inner_factory).parameters)
    return optax.inject_hyperparams(inner_factory, static_args=tuple(sorted(static)), hyperparam_dtype=hyperparam_dtype)


def low_precision_adam(
    learning_rate: optax.ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    *,
    hadam: bool = True,
    loss_scaling: bool = True,
    kahan: bool = True,
    stochastic_rounding: bool = False,
    init_scale: float = 1e4,
    growth_interval: int = 10_000,
    moment_dtype: Any = None,
    moment_block_size: int = DEFAULT_BLOCK_SIZE,
    weight_decay: float | None = None,
    max_grad_norm: float | None = None,
    rounding_seed: int | None = None,
) -> optax.GradientTransformation:
    """Adam (or AdamW) with the low-precision methods as keyword switches.

    The chain, each part present only when its switch or argument asks for it::

        compound_loss_scaling(                                       loss_scaling (init_scale, growth_interval)
            chain(clip_by_global_norm(max_grad_norm),                max_grad_norm
                  hadam | adam (b1, b2, eps, moment_dtype),          hadam (8-bit moments need it)
                  add_decayed_weights(weight_decay) * -lr))          weight_decay (AdamW's decoupled decay)
        then kahan_summation()                                       kahan
          or else stochastic_rounding(rounding_seed)                 stochastic_rounding

    With loss scaling, the caller multiplies its loss by :func:`lpjax.optim.loss_scale` of the state (1 when
    this is off: :func:`loss_scale_or_one`), or uses :func:`lpjax.optim.scaled_value_and_grad`. With loss scaling
    and clipping, the scaler gives the clip the true (unscaled) gradients; without clipping, hAdam (or the injected
    Adam) receives the scaled gradients and the scaler takes the paper's compound path (see
    :func:`lpjax.optim.compound_loss_scaling`). With every switch off and no clipping or decay it is exactly
    ``optax.adam(learning_rate, b1, b2, eps)``. ``moment_dtype`` is the moments' dtype (``None``: the
    parameters'; ``int8`` or an fp8 dtype: blockwise-quantized in blocks of ``moment_block_size``).
    ``rounding_seed`` seeds the stochastic rounding's key (give each network its own; ``None``: 0). The optional
    arguments default to ``None``, not a number, so that optax's ``inject_hyperparams`` leaves them static. The
    other numeric arguments may be injected: ``lpjax.optim.inject_hyperparams(low_precision_adam)(1e-4)``.
    """
    require_wide("low_precision_adam", "learning_rate", learning_rate)
    moment_dtype = None if moment_dtype is None else np.dtype(moment_dtype)
    if is_quantized_dtype(moment_dtype) and not hadam:
        raise ValueError(f"moment_dtype={moment_dtype.name!r} (8-bit, blockwise) needs hadam=True.")
    if weight_decay is not None:
        if hadam:  # the compound path: scale_by_hadam first, the learning rate applied in float32
            inner = optax.chain(
                scale_by_hadam(b1, b2, eps, moment_dtype, moment_block_size),
                optax.add_decayed_weights(weight_decay),
                descend(learning_rate),
            )
        else:
            inner = optax.adamw(learning_rate, b1, b2, eps, mu_dtype=moment_dtype, weight_decay=weight_decay)
    elif hadam:
        inner = _hadam(
            learning_rate, b1=b1, b2=b2, eps=eps, moment_dtype=moment_dtype, moment_block_size=moment_block_size
        )
    elif loss_scaling:  # optax's Adam must expose eps, in the widest float available, for the scaler
        widest = jax.dtypes.canonicalize_dtype(jnp.float64)  # float32 unless float64 is enabled
        inner = optax.inject_hyperparams(optax.adam, static_args="mu_dtype", hyperparam_dtype=widest)(
            learning_rate=learning_rate, b1=b1, b2=b2, eps=eps, mu_dtype=moment_dtype
        )
    else:
        inner = optax.adam(learning_rate, b1=b1, b2=b2, eps=eps, mu_dtype=moment_dtype)
    if max_grad_norm is not None:
        inner = optax.chain(optax.clip_by_global_norm(max_grad_norm), inner)
    if loss_scaling:
        inner = compound_loss_scaling(inner, init_scale=init_scale, growth_interval=growth_interval)
    if kahan:
        return optax.chain(inner, kahan_summation())
    if stochastic_rounding:
        return optax.chain(inner, stochastic_rounding_transform(rounding_seed or 0))
    return inner
