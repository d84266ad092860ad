"""The low-precision training methods, declared once: :class:`PrecisionMethods`, nested in every learner's config.

Each method is a field. Its consumers read it from here and nowhere else:

===================  =========================================================  ======================
field                what it does                                               read by
===================  =========================================================  ======================
hadam                hAdam instead of Adam (:func:`lpjax.optim.hadam`)          ``method_optimizer``
loss_scaling         compound loss scaling (init_scale, growth_interval)        ``method_optimizer``
kahan_gradients      Kahan-compensated parameter updates                        ``method_optimizer``
moment_dtype         the moments' dtype (None: the params'; 8-bit: blockwise)   ``method_optimizer``
stochastic_rounding  stochastically rounded parameter and target updates, each  ``method_optimizer``,
                     one that no Kahan buffer compensates                       ``target_updater``
kahan_momentum       Kahan-compensated target (Polyak) updates                  ``target_updater``
softplus_fix         the policy's log(1 - tanh^2) in its overflow-free form       :mod:`lpjax.agents.sac`
normal_fix           the fp16-safe Gaussian log-density                         :mod:`lpjax.agents.sac`
===================  =========================================================  ======================

(``method_optimizer`` is :func:`method_optimizer` below, ``target_updater``
:func:`lpjax.agents.training.target_updater`.)

Adding a method takes two edits: its field here and its consumer. Everything that lists the methods (the
ablations, the inspector's fields, the reproduction's configs) derives the list from :meth:`switches`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import optax

from lpjax.optim import low_precision_adam
from lpjax.optim.quantized_moments import DEFAULT_BLOCK_SIZE
from lpjax.precision import dtype_of


@dataclasses.dataclass(frozen=True)
class PrecisionMethods:
    """The methods of Björck et al. (2021) and lpjax's additions, each a switch; all off is plain Adam.

    Attributes:
      hadam: hAdam (:func:`lpjax.optim.hadam`) instead of Adam.
      loss_scaling: compound loss scaling (:func:`lpjax.optim.compound_loss_scaling`), starting at
        ``init_scale`` and growing every ``growth_interval`` finite steps.
      init_scale, growth_interval: of the loss scaler.
      kahan_gradients: Kahan-compensated parameter updates (:func:`lpjax.optim.kahan_summation`).
      kahan_momentum: Kahan-compensated target-network updates (:func:`lpjax.optim.kahan_polyak`), the
        compensation kept multiplied by ``kahan_momentum_scale``.
      kahan_momentum_scale: see ``kahan_momentum``.
      softplus_fix: SAC's tanh-squashed policy computes ``log(1 - tanh(u)^2)`` as
        ``2 (log 2 - |u| - log1p(exp(-2|u|)))`` (:func:`lpjax.numerics.tanh_log_det_jacobian`), which no ``u``
        overflows, instead of PyTorch's ``2 (log 2 - u - softplus(-2u))``, whose ``exp(-2u)`` overflows float16
        for ``u < -5.55``.
      normal_fix: SAC's policy computes its Gaussian log-density without squaring a small sigma.
      moment_dtype: a dtype name of :data:`lpjax.precision.DTYPE_NAMES`, or ``"int8"``, for the optimizer's
        moments, or ``None`` for the parameters' dtype. An 8-bit name (``int8``, ``fp8``/``e4m3``, ``e5m2``)
        stores hAdam's moments blockwise-quantized (:mod:`lpjax.optim.quantized_moments`); it needs ``hadam``.
      moment_block_size: elements per quantization block of 8-bit moments (each block has a float32 scale).
      stochastic_rounding: round the parameter and target updates stochastically to the parameters' dtype, an
        alternative to the Kahan buffers, update by update: the parameter update is rounded when
        ``kahan_gradients`` is off, the target update when ``kahan_momentum`` is off. With both Kahan switches
        on it would round nothing, which raises.
    """

    hadam: bool = False
    loss_scaling: bool = False
    init_scale: float = 1e4
    growth_interval: int = 10_000
    kahan_gradients: bool = False
    kahan_momentum: bool = False
    kahan_momentum_scale: float = 1e4
    softplus_fix: bool = False
    normal_fix: bool = False
    moment_dtype: str | None = None
    moment_block_size: int = DEFAULT_BLOCK_SIZE
    stochastic_rounding: bool = False

    def __post_init__(self):
        for name in self.switches():
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"PrecisionMethods: {name} must be True or False, got {getattr(self, name)!r}.")
        if self.moment_dtype is not None:
            moment_dtype_of(self.moment_dtype)  # raises ValueError listing the valid names
        # Numbers may be traced (lpjax.optim.inject_hyperparams(low_precision_adam)): only concrete ones are checked.
        concrete = {
            name: getattr(self, name)
            for name in ("init_scale", "growth_interval", "kahan_momentum_scale", "moment_block_size")
            if isinstance(getattr(self, name), (int, float, np.number))
        }
        for ok, message in [
            (concrete.get("init_scale", 1) >= 1, "init_scale must be >= 1"),
            (concrete.get("growth_interval", 1) >= 1, "growth_interval must be >= 1"),
            (concrete.get("kahan_momentum_scale", 1) > 0, "kahan_momentum_scale must be > 0"),
            (concrete.get("moment_block_size", 1) >= 1, "moment_block_size must be >= 1"),
            (
                not (self.stochastic_rounding and self.kahan_gradients and self.kahan_momentum),
                "stochastic_rounding replaces a Kahan buffer, but kahan_gradients and kahan_momentum are both on: "
                "turn off the one whose update it should round",
            ),
        ]:
            if not ok:
                raise ValueError(f"PrecisionMethods: {message}.")

    @classmethod
    def switches(cls) -> tuple[str, ...]:
        """The names of the on/off methods (the boolean fields), in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.type in ("bool", bool))

    @classmethod
    def paper(cls, **changes: Any) -> PrecisionMethods:
        """The six methods of Björck et al. (2021) on: hAdam, compound loss scaling, Kahan-gradients,
        Kahan-momentum, softplus-fix and normal-fix (plus ``changes``)."""
        return cls(
            **{
                **dict(
                    hadam=True,
                    loss_scaling=True,
                    kahan_gradients=True,
                    kahan_momentum=True,
                    softplus_fix=True,
                    normal_fix=True,
                ),
                **changes,
            }
        )

    @property
    def moment_numpy_dtype(self):
        """``moment_dtype`` as a numpy dtype (``None`` stays ``None``)."""
        return None if self.moment_dtype is None else moment_dtype_of(self.moment_dtype)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | PrecisionMethods) -> PrecisionMethods:
        """From a dict or ``ml_collections.ConfigDict`` (or an instance, returned as is); unknown keys raise
        ``ValueError`` naming the valid ones."""
        if isinstance(values, cls):
            return values
        values = dict(values)
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(f"Unknown precision method keys {unknown}; valid keys: {', '.join(known)}.")
        return cls(**values)


def moment_dtype_of(name: str) -> np.dtype:
    """The numpy dtype of a moment dtype name: a name of :data:`lpjax.precision.DTYPE_NAMES`, or ``"int8"``
    (blockwise-quantized linear codes; not a precision of parameters or activations, so not in that table)."""
    if isinstance(name, str) and name.strip().lower() == "int8":
        return np.dtype(np.int8)
    try:
        return dtype_of(name)
    except ValueError as error:
        raise ValueError(f"{error} (moment_dtype also accepts 'int8')") from None


def method_optimizer(
    learning_rate: Any,
    methods: PrecisionMethods,
    *,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    max_grad_norm: float | None = None,
    rounding_seed: int = 0,
) -> optax.GradientTransformation:
    """The optimizer of a learner's network: :func:`lpjax.optim.low_precision_adam` with ``methods``' optimizer
    switches (``hadam``, ``loss_scaling`` with its scale schedule, ``kahan_gradients``, ``moment_dtype`` and
    ``moment_block_size``, and ``stochastic_rounding`` where ``kahan_gradients`` is off). With every switch off
    and no clipping or decay it is exactly ``optax.adam(learning_rate, b1, b2, eps)``."""
    return low_precision_adam(
        learning_rate,
        b1,
        b2,
        eps,
        hadam=methods.hadam,
        loss_scaling=methods.loss_scaling,
        kahan=methods.kahan_gradients,
        stochastic_rounding=methods.stochastic_rounding,
        init_scale=methods.init_scale,
        growth_interval=methods.growth_interval,
        moment_dtype=methods.moment_numpy_dtype,
        moment_block_size=methods.moment_block_size,
        weight_decay=weight_decay or None,
        max_grad_norm=max_grad_norm,
        rounding_seed=rounding_seed,
    )


__all__ = ["PrecisionMethods", "method_optimizer", "moment_dtype_of"]
