"""What every learner shares: a trainable network (parameters + optimizer state), one loss-scaled gradient step,
the network optimizer and target-network updater built from the paper's method switches, and the behaviour of
the learner configs (validation of the method fields, :meth:`LearnerConfig.from_mapping`).

The off-policy learner configs (:class:`lpjax.agents.sac.SACConfig`, :class:`lpjax.agents.d4pg.D4PGConfig`)
are frozen dataclasses deriving from :class:`OffPolicyConfig`, which declares the fields they share, among them
those :func:`network_optimizer` and :func:`target_updater` read:

* Adam: ``b1``, ``b2``, ``adam_eps``;
* methods (Björck et al., 2021): ``hadam``, ``loss_scaling`` (with ``init_scale``, ``growth_interval``),
  ``kahan_gradients``, ``kahan_momentum`` (with ``kahan_momentum_scale``);
* targets: ``tau`` and ``target_update_period`` (declared by each learner: their defaults differ);
* precision: ``policy`` and ``matmul_impl`` (see :class:`lpjax.nn.Dense`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Self

import chex
import jax
import jax.numpy as jnp
import optax

from lpjax.nn.dense import check_dense_options
from lpjax.optim import (
    OPTIMIZER_SCOPE,
    KahanPolyakState,
    kahan_polyak,
    low_precision_adam,
    scaled_value_and_grad,
)
from lpjax.precision import Policy, get_policy


class Trainable(NamedTuple):
    """Parameters of one network and the state of its optimizer.

    Attributes:
      params: the network's parameters.
      opt_state: its optimizer's state (may hold a loss scaler, see :func:`gradient_step`).
    """

    params: Any
    opt_state: Any


def trainable_init(params: Any, tx: optax.GradientTransformation) -> Trainable:
    """A :class:`Trainable` with a freshly initialised optimizer state."""
    return Trainable(params, tx.init(params))


def gradient_step(trainable: Trainable, tx: optax.GradientTransformation,
                  loss_fn: Callable[..., tuple[chex.Array, Any]], *args) -> tuple[Trainable, chex.Array, Any]:
    """One optimizer step on ``loss_fn(params, *args) -> (loss, aux)``; returns ``(trainable, loss, aux)``.

    The gradients come from :func:`lpjax.optim.scaled_value_and_grad`: the loss is multiplied in float32 by the
    optimizer's loss scale (1 without a scaler), so the backward pass runs in the network's dtype on scaled
    cotangents, and ``tx`` gets the scaled gradients it expects. The optimizer runs under
    ``jax.named_scope(lpjax.optim.OPTIMIZER_SCOPE)`` (metadata only), so :mod:`lpjax.inspect` can tell it apart.
    """
    (loss, aux), grads = scaled_value_and_grad(loss_fn, has_aux=True)(trainable.opt_state, trainable.params, *args)
    with jax.named_scope(OPTIMIZER_SCOPE):
        updates, opt_state = tx.update(grads, trainable.opt_state, trainable.params)
        params = optax.apply_updates(trainable.params, updates)
    return Trainable(params, opt_state), loss, aux


def network_optimizer(learning_rate: optax.ScalarOrSchedule, config: Any) -> optax.GradientTransformation:
    """The optimizer of a learner's networks: :func:`lpjax.optim.low_precision_adam` with the config's switches.

    Reads ``config.b1``, ``b2``, ``adam_eps``, ``hadam``, ``loss_scaling``, ``init_scale``, ``growth_interval``
    and ``kahan_gradients``; with every switch off it is ``optax.adam(learning_rate, b1, b2, adam_eps)``.
    """
    return low_precision_adam(learning_rate, config.b1, config.b2, config.adam_eps, hadam=config.hadam,
                              loss_scaling=config.loss_scaling, kahan=config.kahan_gradients,
                              init_scale=config.init_scale, growth_interval=config.growth_interval)


class TargetUpdater(NamedTuple):
    """Pure ``init``/``update`` pair returned by :func:`target_updater`.

    Attributes:
      init: ``init(target_params) -> compensation``: a :class:`lpjax.optim.KahanPolyakState` with
        Kahan-momentum, else ``None``.
      update: ``update(online_params, target_params, compensation, step) -> (target_params, compensation)``;
        targets (and compensation) change only when ``step % target_update_period == 0``.
    """

    init: Callable[[Any], KahanPolyakState | None]
    update: Callable[[Any, Any, KahanPolyakState | None, chex.Array], tuple[Any, KahanPolyakState | None]]


def target_updater(config: Any) -> TargetUpdater:
    """Target networks following their online networks every ``config.target_update_period`` gradient steps.

    At a step with ``step % target_update_period == 0``:

        tau < 1:  t <- t + tau (p - t)   (optax.incremental_update; Kahan-compensated, scaled by
                                          kahan_momentum_scale, when config.kahan_momentum: lpjax.optim.kahan_polyak)
        tau = 1:  t <- p                 (a hard copy, as Acme's DQN/D4PG targets; no compensation is kept)

    The trees may hold several networks (e.g. ``(actor, critic)``); targets keep their dtype.
    """
    period, tau = config.target_update_period, config.tau
    polyak = kahan_polyak(tau, config.kahan_momentum_scale) if config.kahan_momentum and tau < 1.0 else None

    def init(target_params):
        return polyak.init(target_params) if polyak is not None else None

    def select(apply, new, old):
        return jax.tree.map(lambda n, o: jnp.where(apply, n, o), new, old)

    def update(online_params, target_params, compensation, step):
        apply = step % period == 0
        if tau == 1.0:
            new_target = jax.tree.map(lambda p, t: p.astype(t.dtype), online_params, target_params)
        elif polyak is None:
            new_target = optax.incremental_update(online_params, target_params, tau)
        else:
            new_target, new_compensation = polyak.update(online_params, target_params, compensation)
            compensation = select(apply, new_compensation, compensation)
        return select(apply, new_target, target_params), compensation

    return TargetUpdater(init, update)


class LearnerConfig:
    """Behaviour shared by the learner configs (frozen dataclasses deriving from this class; it adds no fields).

    Subclasses call :meth:`validate` with their own checks at the end of ``__post_init__``. The off-policy
    learners derive from :class:`OffPolicyConfig`, which adds their shared fields.
    """

    def validate(self, checks: Sequence[tuple[bool, str]]) -> None:
        """Raises ``ValueError("<ConfigName>: <message>.")`` for the first failed check.

        Checks ``policy`` first (its error lists the valid names), then ``checks`` (the subclass's own fields).
        """
        get_policy(self.policy)
        for ok, message in checks:
            if not ok:
                raise ValueError(f"{type(self).__name__}: {message}.")

    @property
    def precision(self) -> Policy:
        """The :class:`lpjax.precision.Policy` of the networks."""
        return get_policy(self.policy)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> Self:
        """Builds a config from a dict or ``ml_collections.ConfigDict``; unknown keys raise ``ValueError``."""
        values = dict(values)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            name = cls.__name__.removesuffix("Config")
            raise ValueError(f"Unknown {name} config keys {unknown}; valid keys: {', '.join(sorted(known))}.")
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class OffPolicyConfig(LearnerConfig):
    """The fields SAC and D4PG share, with the same defaults (Björck et al., 2021, Table 4), and their checks.

    ``gamma``; ``tau`` (target Polyak step); ``actor_lr``, ``critic_lr`` and Adam's ``b1``/``b2``/``adam_eps``;
    precision: ``policy`` and ``matmul_impl``; the methods, each a switch: ``hadam``, ``loss_scaling`` (with
    ``init_scale`` and ``growth_interval``), ``kahan_gradients``, ``kahan_momentum`` (with
    ``kahan_momentum_scale``). Subclasses declare ``batch_size`` and ``target_update_period``, and call
    :meth:`validate` at the end of ``__post_init__``.
    """

    gamma: float = 0.99
    tau: float = 0.005
    actor_lr: float = 1e-4
    critic_lr: float = 1e-4
    b1: float = 0.9
    b2: float = 0.999
    adam_eps: float = 1e-8
    policy: str = "fp32"
    matmul_impl: str = "xla"
    hadam: bool = False
    loss_scaling: bool = False
    init_scale: float = 1e4
    growth_interval: int = 10_000
    kahan_gradients: bool = False
    kahan_momentum: bool = False
    kahan_momentum_scale: float = 1e4

    def validate(self, checks: Sequence[tuple[bool, str]]) -> None:
        """Raises ``ValueError("<ConfigName>: <message>.")`` for the first failed check.

        Checks ``policy`` and ``matmul_impl`` first (their errors list the valid values), then ``checks`` (the
        subclass's own fields), then the fields read by :func:`network_optimizer` and :func:`target_updater`.
        """
        check_dense_options(get_policy(self.policy), self.matmul_impl, "none")
        super().validate([
            *checks,
            (0.0 < self.tau <= 1.0, "tau must be in (0, 1]"),
            (self.target_update_period >= 1, "target_update_period must be >= 1"),
            (0.0 <= self.b1 < 1.0 and 0.0 <= self.b2 < 1.0, "b1 and b2 must be in [0, 1)"),
            (self.adam_eps >= 0, "adam_eps must be >= 0"),
            (self.init_scale >= 1, "init_scale must be >= 1"),
            (self.growth_interval >= 1, "growth_interval must be >= 1"),
            (self.kahan_momentum_scale > 0, "kahan_momentum_scale must be > 0"),
        ])
