"""Low-precision optax transforms: hAdam, compound loss scaling, Kahan summation and Kahan Polyak averaging.

Everything here is an ``optax.GradientTransformation`` (or a pure init/update pair) and composes with
``optax.chain``. A complete pure-fp16 optimizer, as in Björck et al. (2021)::

    tx = optax.chain(
        lpjax.optim.compound_loss_scaling(lpjax.optim.hadam(1e-4)),
        lpjax.optim.kahan_summation(),
    )
    opt_state = tx.init(params)
    grads = jax.grad(lambda p: loss(p) * lpjax.optim.loss_scale(opt_state))(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
"""

from lpjax.optim.alias import low_precision_adam
from lpjax.optim.hadam import EpsUnderflowWarning, ScaleByHAdamState, hadam, scale_by_hadam
from lpjax.optim.kahan import (KahanPolyak, KahanPolyakState, KahanSummationState, kahan_polyak,
                               kahan_summation)
from lpjax.optim.loss_scaling import (PYTORCH_AMP_DEFAULTS, CompoundLossScalingState, compound_loss_scaling,
                                      loss_scale, loss_scale_or_one, rescale_moments)

OPTIMIZER_SCOPE = "optimizer"
"""``jax.named_scope`` under which lpjax's learners run their optimizer's update (``tx.update`` and
``optax.apply_updates``); :mod:`lpjax.inspect` attributes operations in it to the optimizer."""

__all__ = [
    "OPTIMIZER_SCOPE", "CompoundLossScalingState", "EpsUnderflowWarning", "KahanPolyak", "KahanPolyakState", "KahanSummationState",
    "PYTORCH_AMP_DEFAULTS", "ScaleByHAdamState", "compound_loss_scaling", "hadam", "kahan_polyak",
    "kahan_summation", "loss_scale", "loss_scale_or_one", "low_precision_adam", "rescale_moments",
    "scale_by_hadam",
]
