"""Low-precision optax transforms: hAdam (optionally with 8-bit blockwise moments), loss scaling, Kahan summation,
Kahan Polyak averaging, and stochastically rounded parameter and target updates.

Everything here is an ``optax.GradientTransformation`` (or a pure init/update pair) and composes with
``optax.chain``. A complete pure-fp16 optimizer, as in Björck et al. (2021)::

    tx = optax.chain(
        lpjax.optim.compound_loss_scaling(lpjax.optim.hadam(1e-4)),
        lpjax.optim.kahan_summation(),
    )
    opt_state = tx.init(params)
    loss, grads = lpjax.optim.scaled_value_and_grad(loss_fn)(opt_state, params, batch)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)

:func:`compound_loss_scaling` wraps any optax optimizer: the paper's compound path where the gradients go to
hAdam (or an injected ``optax.adam``) first, the true gradients everywhere else.

Wiring that would train silently wrong is refused at trace or init time, in one line that names the fix: an
increment transform (``kahan_summation``, ``stochastic_rounding``) anywhere but last, ``scaled_value_and_grad``
given ``None``, the optimizer or the parameters instead of the optimizer's state, ``optax.apply_if_finite``
inside the scaler with float16 parameters; a scaler whose loss nobody scaled warns once
(:class:`UnscaledLossWarning`). See :mod:`lpjax.optim._misuse`.
"""

from lpjax.optim._misuse import UnscaledLossWarning
from lpjax.optim.alias import inject_hyperparams, low_precision_adam
from lpjax.optim.flat import FlatBuffer, FusedState, fused, fused_target_update
from lpjax.optim.hadam import ScaleByHAdamState, hadam, scale_by_hadam
from lpjax.optim.kahan import KahanPolyak, KahanPolyakState, KahanSummationState, kahan_polyak, kahan_summation
from lpjax.optim.loss_scaling import (
    PYTORCH_AMP_DEFAULTS,
    CompoundLossScalingState,
    all_finite,
    compound_loss_scaling,
    rescale_moments,
)
from lpjax.optim.quantized_moments import BlockQuantized
from lpjax.optim.scaled_grad import loss_scale, loss_scale_or_one, scaled_value_and_grad, skipped_steps
from lpjax.optim.stochastic_rounding import (
    StochasticRoundingPolyak,
    StochasticRoundingState,
    stochastic_round,
    stochastic_rounding,
    stochastic_rounding_polyak,
)

OPTIMIZER_SCOPE = "optimizer"
"""``jax.named_scope`` under which lpjax's learners run their optimizer's update (``tx.update`` and
``optax.apply_updates``); :mod:`lpjax.inspect` attributes operations in it to the optimizer."""

__all__ = [
    "OPTIMIZER_SCOPE",
    "FlatBuffer",
    "FusedState",
    "fused",
    "fused_target_update",
    "BlockQuantized",
    "StochasticRoundingPolyak",
    "StochasticRoundingState",
    "UnscaledLossWarning",
    "stochastic_round",
    "stochastic_rounding",
    "stochastic_rounding_polyak",
    "PYTORCH_AMP_DEFAULTS",
    "CompoundLossScalingState",
    "KahanPolyak",
    "KahanPolyakState",
    "KahanSummationState",
    "ScaleByHAdamState",
    "all_finite",
    "compound_loss_scaling",
    "hadam",
    "inject_hyperparams",
    "kahan_polyak",
    "kahan_summation",
    "loss_scale",
    "loss_scale_or_one",
    "low_precision_adam",
    "rescale_moments",
    "scale_by_hadam",
    "scaled_value_and_grad",
    "skipped_steps",
]
