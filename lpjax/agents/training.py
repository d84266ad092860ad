"""What every learner shares: a trainable network (parameters + optimizer state), one loss-scaled gradient step,
the network optimizer and target-network updater built from the learner's :class:`lpjax.methods.PrecisionMethods`,
and the behaviour of the learner configs (:meth:`LearnerConfig.from_mapping`, validation).

Every learner config (:class:`lpjax.agents.sac.SACConfig`, :class:`lpjax.agents.d4pg.D4PGConfig`,
:class:`lpjax.agents.grpo.GRPOConfig`) is a frozen dataclass deriving from :class:`LearnerConfig`, which declares
what they all have: the networks' precision ``policy``, the ``methods`` and Adam's ``b1``, ``b2`` and ``adam_eps``.
The off-policy learners derive from :class:`OffPolicyConfig`, which adds their shared fields: ``gamma``,
learning rates, ``matmul_impl`` (see :class:`lpjax.nn.Dense`) and the targets' ``tau`` and
``target_update_period`` (declared by each learner: their defaults differ).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Self

import chex
import flax
import jax
import jax.numpy as jnp
import optax

from lpjax.methods import PrecisionMethods, method_optimizer
from lpjax.nn.dense import check_dense_options
from lpjax.optim import (
    OPTIMIZER_SCOPE,
    KahanPolyakState,
    StochasticRoundingState,
    fused,
    fused_target_update,
    kahan_polyak,
    scaled_value_and_grad,
    stochastic_rounding_polyak,
)
from lpjax.optim.quantized_moments import is_quantized_dtype
from lpjax.precision import Policy, get_policy

TargetState = KahanPolyakState | StochasticRoundingState | None


class Trainable(NamedTuple):
    """Parameters of one network and the state of its optimizer.

    Attributes:
      params: the network's parameters.
      opt_state: its optimizer's state (may hold a loss scaler, see :func:`gradient_step`).
    """

    params: Any
    opt_state: Any


@flax.struct.dataclass
class ActorCriticState:
    """What every actor-critic learner's state begins with; a learner's state subclasses it and adds its target
    networks. One pytree, checkpointed whole.

    Attributes:
      config: the learner's config (static: part of the tree structure, not a leaf).
      action_dim: number of action dimensions (static).
      step: int32, gradient steps done.
      key: PRNG key of the learner.
      actor: :class:`Trainable` of the policy network.
      critic: :class:`Trainable` of the critic.
    """

    config: Any = flax.struct.field(pytree_node=False)
    action_dim: int = flax.struct.field(pytree_node=False)
    step: jax.Array
    key: jax.Array
    actor: Trainable
    critic: Trainable


def trainable_init(params: Any, tx: optax.GradientTransformation) -> Trainable:
    """A :class:`Trainable` with a freshly initialised optimizer state."""
    return Trainable(params, tx.init(params))


def gradient_step(
    trainable: Trainable, tx: optax.GradientTransformation, loss_fn: Callable[..., tuple[chex.Array, Any]], *args
) -> tuple[Trainable, chex.Array, Any]:
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


def network_optimizer(
    learning_rate: optax.ScalarOrSchedule,
    config: LearnerConfig,
    *,
    weight_decay: float = 0.0,
    max_grad_norm: float | None = None,
    rounding_seed: int = 0,
) -> optax.GradientTransformation:
    """The optimizer of a learner's networks: :func:`lpjax.methods.method_optimizer` with ``config.methods`` and
    Adam's ``config.b1``, ``b2`` and ``adam_eps``; with every method off it is ``optax.adam``. With
    ``config.fused_optimizer`` it runs over one flat buffer per dtype (:func:`lpjax.optim.fused`, leaves padded to
    the block size of 8-bit moments): the same bits, in a handful of kernels whatever the number of leaves.

    ``rounding_seed`` seeds stochastic rounding (``methods.stochastic_rounding``): a learner gives each of its
    networks its own, and :func:`target_updater` uses :data:`TARGET_ROUNDING_SEED`."""
    tx = method_optimizer(
        learning_rate,
        config.methods,
        b1=config.b1,
        b2=config.b2,
        eps=config.adam_eps,
        weight_decay=weight_decay,
        max_grad_norm=max_grad_norm,
        rounding_seed=rounding_seed,
    )
    if not config.fused_optimizer:
        return tx
    methods = config.methods
    return fused(tx, methods.moment_block_size if is_quantized_dtype(methods.moment_numpy_dtype) else 1)


TARGET_ROUNDING_SEED = 2
"""The seed of the target networks' stochastic rounding, apart from the networks' optimizers' (0, 1)."""


class TargetUpdater(NamedTuple):
    """Pure ``init``/``update`` pair returned by :func:`target_updater`.

    Attributes:
      init: ``init(target_params) -> compensation``: the target update's state, a
        :class:`lpjax.optim.KahanPolyakState` with Kahan-momentum, a :class:`lpjax.optim.StochasticRoundingState`
        (one key) with stochastic rounding, else ``None``.
      update: ``update(online_params, target_params, compensation, step) -> (target_params, compensation)``;
        targets (and compensation) change only when ``step % target_update_period == 0``.
    """

    init: Callable[[Any], TargetState]
    update: Callable[[Any, Any, TargetState, chex.Array], tuple[Any, TargetState]]


def target_updater(config: OffPolicyConfig) -> TargetUpdater:
    """Target networks following their online networks every ``config.target_update_period`` gradient steps.

    At a step with ``step % target_update_period == 0``:

        tau < 1:  t <- t + tau (p - t)   (optax.incremental_update; Kahan-compensated, scaled by
                                          kahan_momentum_scale, with methods.kahan_momentum: lpjax.optim.kahan_polyak;
                                          else rounded stochastically with methods.stochastic_rounding:
                                          lpjax.optim.stochastic_rounding_polyak, seeded with TARGET_ROUNDING_SEED)
        tau = 1:  t <- p                 (a hard copy, as Acme's DQN/D4PG targets; no compensation is kept)

    The trees may hold several networks (e.g. ``(actor, critic)``); targets keep their dtype. With
    ``config.fused_optimizer`` a compensated or stochastically rounded update runs over one flat buffer per dtype
    (:func:`lpjax.optim.fused_target_update`; the same bits).
    """
    period, tau, methods = config.target_update_period, config.tau, config.methods
    polyak = None
    if methods.kahan_momentum and tau < 1.0:
        polyak = kahan_polyak(tau, methods.kahan_momentum_scale)
    elif methods.stochastic_rounding and tau < 1.0:
        polyak = stochastic_rounding_polyak(tau, TARGET_ROUNDING_SEED)
    if polyak is not None and config.fused_optimizer:
        polyak = fused_target_update(polyak)

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


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
    """The fields and behaviour every learner config shares (frozen, hashable dataclasses deriving from this one).

    Attributes:
      policy: the networks' precision policy, a name or spec for :func:`lpjax.precision.get_policy`.
      methods: the low-precision methods (:class:`lpjax.methods.PrecisionMethods`); a mapping is converted.
      b1, b2, adam_eps: Adam's hyper-parameters, for :func:`network_optimizer`.
      fused_optimizer: run the optimizer and the target update over one flat buffer per dtype
        (:func:`lpjax.optim.fused`): the same bits as per leaf, in a fixed handful of kernels. FSDP (a mesh with
        ``fsdp > 1``) splits the state leaf by leaf and needs it off (the runs refuse the pair in one line); it is
        part of a run's config, so a run resumes with the layout it started with.

    Subclasses call :meth:`validate` with their own checks at the end of ``__post_init__``.
    """

    policy: str = "fp32"
    methods: PrecisionMethods = PrecisionMethods()
    b1: float = 0.9
    b2: float = 0.999
    adam_eps: float = 1e-8
    fused_optimizer: bool = True

    def validate(self, checks: Sequence[tuple[bool, str]]) -> None:
        """Raises ``ValueError("<ConfigName>: <message>.")`` for the first failed check.

        Converts ``methods`` from a mapping, checks ``policy`` (its error lists the valid names), Adam's fields,
        then ``checks`` (the subclass's own fields).
        """
        object.__setattr__(self, "methods", PrecisionMethods.from_mapping(self.methods))
        self.precision  # noqa: B018 -- parses the policy once; its error lists the valid names
        for ok, message in [
            (0.0 <= self.b1 < 1.0 and 0.0 <= self.b2 < 1.0, "b1 and b2 must be in [0, 1)"),
            (self.adam_eps >= 0, "adam_eps must be >= 0"),
            *checks,
        ]:
            if not ok:
                raise ValueError(f"{type(self).__name__}: {message}.")

    @functools.cached_property
    def precision(self) -> Policy:
        """The :class:`lpjax.precision.Policy` of the networks: ``policy`` parsed once, at the config boundary, and
        handed inward to the networks as this object."""
        return get_policy(self.policy)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> Self:
        """Builds a config from a dict or ``ml_collections.ConfigDict`` (``methods`` may be a nested mapping);
        unknown keys raise ``ValueError`` naming the valid ones."""
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

    ``gamma``; ``tau`` (target Polyak step); ``actor_lr`` and ``critic_lr``; ``matmul_impl`` (see
    :class:`lpjax.nn.Dense`); ``high_precision_ends`` (the first and last layer of every MLP multiply in the
    policy's compute dtype, not its matmul dtype: an fp8 policy's GEMMs on the hidden layers only, see
    :class:`lpjax.nn.MLP`). Subclasses declare ``batch_size`` and ``target_update_period``, and call
    :meth:`validate` at the end of ``__post_init__``.
    """

    gamma: float = 0.99
    tau: float = 0.005
    actor_lr: float = 1e-4
    critic_lr: float = 1e-4
    matmul_impl: str = "xla"
    high_precision_ends: bool = False

    def validate(self, checks: Sequence[tuple[bool, str]]) -> None:
        """Raises ``ValueError("<ConfigName>: <message>.")`` for the first failed check.

        Checks ``policy`` and ``matmul_impl`` first (their errors list the valid values), then ``checks`` (the
        subclass's own fields), then the target fields read by :func:`target_updater`.
        """
        check_dense_options(self.precision, self.matmul_impl, "none")
        super().validate(
            [
                *checks,
                (0.0 < self.tau <= 1.0, "tau must be in (0, 1]"),
                (self.target_update_period >= 1, "target_update_period must be >= 1"),
            ]
        )
