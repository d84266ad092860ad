"""D4PG (Barth-Maron et al., 2018) as pure functions over a :class:`D4PGState` pytree.

A deterministic actor ``mu`` and a categorical critic ``Z(s, a)`` (logits over atoms ``z_1..z_A`` evenly spaced on
``[v_min, v_max]``), as in Acme's D4PG and ActorQ, with every optimizer method of Björck et al. (2021) behind a
switch of ``D4PGConfig.methods`` (:class:`lpjax.methods.PrecisionMethods`):

    critic:  p' = softmax(Z'(s', mu'(s'))),   y = Pi_z(r + D z, p')        (target actor and critic, no gradient)
             L_Z = mean_batch -sum_i y_i log softmax(Z(s, a))_i
    actor:   L_mu = -mean_batch Q(s, mu(s)),  Q(s, a) = sum_i softmax(Z(s, a))_i z_i   (DPG through the critic)
    targets: (mu', Z') <- (mu', Z') + tau ((mu, Z) - (mu', Z'))   (every target_update_period; tau = 1: hard copy;
             Kahan-compensated with methods.kahan_momentum)

``Pi_z`` is :func:`~lpjax.agents.d4pg.distributional.categorical_l2_project`. ``r`` is the n-step discounted
reward and ``D`` the bootstrap multiplier (``gamma^n`` times the environment's discounts: 0 at a terminal, kept
at a time-limit truncation), both made by :class:`lpjax.nstep.NStepAccumulator`; the learner adds no ``gamma``.
The critic steps first; the actor then climbs the updated critic; the targets follow both.

The networks run in the policy's compute dtype. The distributional head (softmax, log-softmax, expected value,
projection: ``(batch, atoms)`` arrays, negligible next to the MLPs) runs in float32 (float64 when the policy
is), and losses are reduced and loss-scaled in float32 (:func:`lpjax.agents.training.gradient_step`).
"""

from __future__ import annotations

import functools
from typing import Any

import flax
import jax
import jax.numpy as jnp

from lpjax.agents.d4pg.config import D4PGConfig
from lpjax.agents.d4pg.distributional import categorical_l2_project, expected_value
from lpjax.agents.training import (
    ActorCriticState,
    TargetState,
    gradient_step,
    network_optimizer,
    target_updater,
    trainable_init,
)
from lpjax.nn import CategoricalCritic, DeterministicActor
from lpjax.optim import loss_scale_or_one, skipped_steps


@flax.struct.dataclass
class D4PGState(ActorCriticState):
    """Everything D4PG's learner carries: :class:`~lpjax.agents.training.ActorCriticState` (its ``config`` a
    :class:`D4PGConfig`, its actor deterministic, its critic categorical; the update is deterministic and leaves
    ``key`` unchanged, carried so a checkpoint holds what a stochastic variant such as target-policy smoothing
    would need) and:

    Attributes:
      target_actor: parameters of the target policy.
      target_critic: parameters of the target critic.
      target_compensation: the target update's state (:data:`lpjax.agents.training.TargetState`): the Kahan
        compensation of ``(target_actor, target_critic)``, the stochastic rounding's key, or ``None`` (neither
        method, or hard copies, ``tau = 1``).
    """

    target_actor: Any
    target_critic: Any
    target_compensation: TargetState


def actor_network(config: D4PGConfig, action_dim: int) -> DeterministicActor:
    """The policy as a Flax module: ``actor_network(config, action_dim).apply(state.actor.params, obs)`` gives
    deterministic actions in [-1, 1] (in the policy's compute dtype) for observations ``(..., obs_dim)``."""
    return DeterministicActor(
        config.actor_hidden, action_dim, config.precision, config.matmul_impl, config.high_precision_ends
    )


def critic_network(config: D4PGConfig) -> CategoricalCritic:
    """The critic as a Flax module: ``apply(params, obs, action)`` gives ``(..., num_atoms)`` logits."""
    return CategoricalCritic(
        config.critic_hidden, config.num_atoms, config.precision, config.matmul_impl, config.high_precision_ends
    )


def atoms(config: D4PGConfig, dtype: Any = jnp.float32) -> jax.Array:
    """The critic's support: ``num_atoms`` values evenly spaced on ``[v_min, v_max]``."""
    return jnp.linspace(config.v_min, config.v_max, config.num_atoms, dtype=dtype)


def _head_dtype(logits: jax.Array) -> jnp.dtype:
    """float32, or the logits' dtype if wider: the dtype of the distributional head."""
    return jnp.promote_types(logits.dtype, jnp.float32)


def init(key: jax.Array, observation: jax.Array, action_dim: int, config: D4PGConfig) -> D4PGState:
    """Initial state for flat observations shaped like ``observation`` (one, unbatched) and ``action_dim`` actions.

    Target networks start as copies of the online ones.

    Raises:
      ValueError: for a non-flat observation or ``action_dim < 1``.
    """
    observation = jnp.asarray(observation)
    if observation.ndim != 1:
        raise ValueError(f"D4PG needs flat observations, got shape {observation.shape}.")
    if action_dim < 1:
        raise ValueError(f"action_dim must be >= 1, got {action_dim}.")
    key, actor_key, critic_key = jax.random.split(key, 3)
    obs = observation[None]
    actor_params = actor_network(config, action_dim).init(actor_key, obs)
    critic_params = critic_network(config).init(critic_key, obs, jnp.zeros((1, action_dim), jnp.float32))
    copy = functools.partial(jax.tree.map, jnp.copy)  # own buffers: the state is donated to update
    return D4PGState(
        config=config,
        action_dim=int(action_dim),
        step=jnp.zeros([], jnp.int32),
        key=key,
        actor=trainable_init(actor_params, network_optimizer(config.actor_lr, config)),
        critic=trainable_init(critic_params, network_optimizer(config.critic_lr, config, rounding_seed=1)),
        target_actor=copy(actor_params),
        target_critic=copy(critic_params),
        target_compensation=target_updater(config).init((actor_params, critic_params)),
    )


def _critic_loss(critic_params, state: D4PGState, batch):
    config = state.config
    critic_net = critic_network(config)
    next_action = actor_network(config, state.action_dim).apply(state.target_actor, batch["next_obs"])
    next_logits = critic_net.apply(state.target_critic, batch["next_obs"], next_action)
    logits = critic_net.apply(critic_params, batch["obs"], batch["action"])
    dtype = _head_dtype(logits)
    z = atoms(config, dtype)
    shifted = batch["reward"].astype(dtype)[:, None] + batch["discount"].astype(dtype)[:, None] * z
    target = categorical_l2_project(shifted, jax.nn.softmax(next_logits.astype(dtype), axis=-1), z)
    log_probs = jax.nn.log_softmax(logits.astype(dtype), axis=-1)
    loss = jnp.mean(-jnp.sum(jax.lax.stop_gradient(target) * log_probs, axis=-1), dtype=jnp.float32)
    return loss, {
        "q_mean": jnp.mean(jnp.sum(jnp.exp(log_probs) * z, axis=-1), dtype=jnp.float32),
        "target_q_mean": jnp.mean(jnp.sum(target * z, axis=-1), dtype=jnp.float32),
    }


def _actor_loss(actor_params, state: D4PGState, obs):
    config = state.config
    action = actor_network(config, state.action_dim).apply(actor_params, obs)
    logits = critic_network(config).apply(state.critic.params, obs, action)
    dtype = _head_dtype(logits)
    return -jnp.mean(expected_value(logits.astype(dtype), atoms(config, dtype)), dtype=jnp.float32), None


def _update(state: D4PGState, batch: dict) -> tuple[D4PGState, dict]:
    config = state.config
    with jax.named_scope("critic"):  # name scopes (metadata only) label the phases in lpjax.inspect's reports
        critic, critic_loss, critic_aux = gradient_step(
            state.critic, network_optimizer(config.critic_lr, config, rounding_seed=1), _critic_loss, state, batch
        )
    state = state.replace(critic=critic)
    with jax.named_scope("actor"):
        actor, actor_loss, _ = gradient_step(
            state.actor, network_optimizer(config.actor_lr, config), _actor_loss, state, batch["obs"]
        )
    with jax.named_scope("target"):
        (target_actor, target_critic), compensation = target_updater(config).update(
            (actor.params, critic.params),
            (state.target_actor, state.target_critic),
            state.target_compensation,
            state.step,
        )
    metrics = {"critic_loss": critic_loss, "actor_loss": actor_loss, **critic_aux}
    if config.methods.loss_scaling:
        metrics.update(
            critic_loss_scale=loss_scale_or_one(critic.opt_state),
            actor_loss_scale=loss_scale_or_one(actor.opt_state),
            critic_skipped_steps=skipped_steps(critic.opt_state).astype(jnp.float32),
            actor_skipped_steps=skipped_steps(actor.opt_state).astype(jnp.float32),
        )
    return state.replace(
        step=state.step + 1,
        actor=actor,
        target_actor=target_actor,
        target_critic=target_critic,
        target_compensation=compensation,
    ), metrics


update = jax.jit(_update, donate_argnums=0)
update.__doc__ = """``update(state, batch) -> (state, metrics)``: one D4PG gradient step, jitted, ``state`` donated.

``batch`` is a dict of arrays with a leading batch axis: ``obs``, ``action``, ``reward`` (the n-step discounted
reward sum), ``discount`` (the bootstrap multiplier: ``gamma^n`` times the environment's discounts, 0 at a
terminal) and ``next_obs`` (the observation ``n`` steps later), as :class:`lpjax.nstep.NStepAccumulator` emits
them. Metrics are float32 scalars: ``critic_loss`` (cross-entropy), ``actor_loss`` (``-Q``), ``q_mean`` (the
critic's expected value at the batch's actions), ``target_q_mean`` (of the projected targets), and
``critic_loss_scale``/``actor_loss_scale`` and ``critic_skipped_steps``/``actor_skipped_steps`` (the updates each
loss scaler has skipped so far) with ``methods.loss_scaling``."""


@functools.partial(jax.jit, static_argnames=("config", "action_dim"))
def act(
    actor_params: Any, obs: jax.Array, key: jax.Array, sigma: jax.Array | float, config: D4PGConfig, action_dim: int
) -> jax.Array:
    """Exploration actions: ``clip(mu(obs) + sigma * N(0, 1), -1, 1)`` in float32.

    Args:
      actor_params: the policy's parameters (``state.actor.params``, or a copy pulled by an actor).
      obs: observations ``(obs_dim,)`` or ``(batch, obs_dim)``.
      key: PRNG key of the noise.
      sigma: noise standard deviation, a runtime value (changing it does not recompile): a scalar, or one per
        row of a batch, ``(batch,)`` (ActorQ gives each actor its own sigma in [0, 0.2]). ``0`` gives ``mu(obs)``.
      config, action_dim: static; select the network.

    Returns:
      ``obs.shape[:-1] + (action_dim,)`` float32 actions in [-1, 1].
    """
    action = actor_network(config, action_dim).apply(actor_params, obs).astype(jnp.float32)
    sigma = jnp.asarray(sigma, jnp.float32)
    sigma = sigma.reshape(sigma.shape + (1,) * (action.ndim - sigma.ndim))
    return jnp.clip(action + sigma * jax.random.normal(key, action.shape, jnp.float32), -1.0, 1.0)
