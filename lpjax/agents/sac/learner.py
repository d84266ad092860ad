"""Soft Actor-Critic (Haarnoja et al., 2018) as pure functions over a :class:`SACState` pytree.

Follows pytorch_sac (Yarats & Kostrikov) and, for pixels, DrQ (Kostrikov et al., 2020), with every
low-precision method of Björck et al. (2021) behind a switch of ``SACConfig.methods``
(:class:`lpjax.methods.PrecisionMethods`):

    critic:      y = r + gamma * d * (min_i Q'_i(s', a') - alpha log pi(a'|s')),  a' ~ pi(s')
                 L_Q = mean_batch sum_i (Q_i(s, a) - y)^2
    actor:       L_pi = mean_batch (alpha log pi(a|s) - min_i Q_i(s, a)),  a ~ pi(s)   (every actor_update_period)
    temperature: L_alpha = mean_batch alpha (-log pi(a|s) - H_target),  alpha = exp(log_alpha)
    target:      Q' <- Q' + tau (Q - Q')   (every target_update_period; Kahan-compensated with methods.kahan_momentum)

``d`` is 0 only at a true terminal state; time-limit truncations bootstrap (``d = 1``), as in pytorch_sac.
Losses are reduced and scaled in float32; everything per-sample runs in the policy's compute dtype.
"""

from __future__ import annotations

import functools
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from lpjax.agents.sac.config import SACConfig
from lpjax.agents.sac.squashed_gaussian import sample_and_log_prob
from lpjax.agents.training import (
    ActorCriticState,
    TargetState,
    Trainable,
    gradient_step,
    network_optimizer,
    target_updater,
    trainable_init,
)
from lpjax.nn import DoubleCritic, PixelEncoder, TanhGaussianActor
from lpjax.optim import loss_scale_or_one, skipped_steps


class SACCritic(nn.Module):
    """Twin Q-networks, behind a :class:`lpjax.nn.PixelEncoder` when learning from pixels.

    ``encode(obs)`` gives the features the Q-networks (and, without gradient, the actor) see: the encoder's
    output from pixels, the observation itself from states.
    """

    config: SACConfig

    def setup(self):
        cfg = self.config
        self.encoder = (
            PixelEncoder(
                cfg.encoder_features,
                policy=cfg.precision,
                standardize=cfg.weight_standardization,
                clip=cfg.encoder_clip,
            )
            if cfg.pixels
            else None
        )
        self.q = DoubleCritic(cfg.hidden_dims, cfg.precision, cfg.matmul_impl, cfg.high_precision_ends)

    def encode(self, obs: jax.Array) -> jax.Array:
        return self.encoder(obs) if self.encoder is not None else self.config.precision.cast_to_compute(obs)

    def __call__(self, obs: jax.Array, action: jax.Array) -> jax.Array:
        return self.q(self.encode(obs), action)

    def from_features(self, features: jax.Array, action: jax.Array) -> jax.Array:
        return self.q(features, action)


@flax.struct.dataclass
class SACState(ActorCriticState):
    """Everything SAC's training carries: :class:`~lpjax.agents.training.ActorCriticState` (its ``config`` a
    :class:`SACConfig`, its ``key`` for sampling actions and augmentations in ``update``, its critic the twin
    critic and the pixel encoder) and:

    Attributes:
      target_critic: parameters of the target critic.
      target_compensation: the target update's state (:data:`lpjax.agents.training.TargetState`): the Kahan
        compensation of the target critic, the stochastic rounding's key, or ``None``.
      temperature: Trainable of ``log_alpha`` (float32 scalar).
    """

    target_critic: Any
    target_compensation: TargetState
    temperature: Trainable


def networks(config: SACConfig, action_dim: int) -> tuple[TanhGaussianActor, SACCritic]:
    """The Flax modules ``(actor, critic)`` of ``config`` for ``action_dim`` actions (the state holds their
    parameters: ``actor.apply(state.actor.params, features)``)."""
    actor = TanhGaussianActor(
        config.hidden_dims,
        action_dim,
        config.log_std_bounds,
        config.precision,
        config.matmul_impl,
        config.high_precision_ends,
    )
    return actor, SACCritic(config)


def _optimizers(config: SACConfig):
    return (
        network_optimizer(config.actor_lr, config),
        network_optimizer(config.critic_lr, config, rounding_seed=1),
        optax.adam(config.alpha_lr, config.b1, config.b2),
    )


def init(key: jax.Array, observation: jax.Array, action_dim: int, config: SACConfig) -> SACState:
    """Initial state for observations shaped like ``observation`` (one, unbatched) and ``action_dim`` actions.

    Raises:
      ValueError: for a config/observation mismatch (pixels need uint8 ``(H, W, C)`` images, states a vector).
    """
    observation = jnp.asarray(observation)
    if config.pixels and (observation.ndim != 3 or observation.dtype != jnp.uint8):
        raise ValueError(
            f"SAC from pixels needs uint8 (H, W, C) observations, got {observation.dtype} {observation.shape}."
        )
    if not config.pixels and observation.ndim != 1:
        raise ValueError(f"SAC from states needs flat observations, got shape {observation.shape}.")
    if action_dim < 1:
        raise ValueError(f"action_dim must be >= 1, got {action_dim}.")
    actor_net, critic_net = networks(config, action_dim)
    actor_tx, critic_tx, temperature_tx = _optimizers(config)
    key, actor_key, critic_key = jax.random.split(key, 3)
    obs = observation[None]
    critic_params = critic_net.init(critic_key, obs, jnp.zeros((1, action_dim), jnp.float32))
    features = critic_net.apply(critic_params, obs, method=SACCritic.encode)
    actor_params = actor_net.init(actor_key, features)
    log_alpha = jnp.log(jnp.asarray(config.init_temperature, jnp.float32))
    return SACState(
        config=config,
        action_dim=int(action_dim),
        step=jnp.zeros([], jnp.int32),
        key=key,
        actor=trainable_init(actor_params, actor_tx),
        critic=trainable_init(critic_params, critic_tx),
        target_critic=jax.tree.map(jnp.copy, critic_params),  # own buffers: the state is donated to update
        target_compensation=target_updater(config).init(critic_params),
        temperature=trainable_init(log_alpha, temperature_tx),
    )


def random_shift(key: jax.Array, images: jax.Array, pad: int) -> jax.Array:
    """DrQ's augmentation: pad each image by ``pad`` pixels (edge values) and crop back at a random offset."""
    if pad == 0:
        return images
    height, width = images.shape[-3:-1]
    padded = jnp.pad(images, [(0, 0)] * (images.ndim - 3) + [(pad, pad), (pad, pad), (0, 0)], mode="edge")
    offsets = jax.random.randint(key, images.shape[:-3] + (2,), 0, 2 * pad + 1)

    def crop(image, offset):
        return jax.lax.dynamic_slice(image, (offset[0], offset[1], 0), (height, width, image.shape[-1]))

    return jax.vmap(crop)(padded.reshape((-1,) + padded.shape[-3:]), offsets.reshape(-1, 2)).reshape(images.shape)


def _differentiated(config: SACConfig, net: nn.Module, method=None):
    """``net.apply`` (of ``method``) for a forward pass the loss differentiates: under ``jax.checkpoint`` with
    ``config.rematerialize``, so the backward pass recomputes the network's activations from its inputs and
    parameters instead of holding them (the same values, one more forward pass)."""
    apply = functools.partial(net.apply, method=method)
    return jax.checkpoint(apply) if config.rematerialize else apply


def _sample_action(config: SACConfig, actor_net, actor_params, features, key):
    mean, log_std = _differentiated(config, actor_net)(actor_params, features)
    methods = config.methods
    return sample_and_log_prob(
        key, mean, log_std, normal_fix=methods.normal_fix, softplus_fix=methods.softplus_fix, sigma_eps=config.sigma_eps
    )


def critic_loss(critic_params, state: SACState, batch, next_features, key):
    """``(L_Q, {"q", "target_q"})`` of the module docstring for ``critic_params``, the rest read from ``state``
    (``next_features``: the critic's encoding of ``batch["next_obs"]``, without gradient; ``key``: the next
    actions' sample). What :func:`critic_update` differentiates."""
    config = state.config
    actor_net, critic_net = networks(config, state.action_dim)
    alpha = jnp.exp(state.temperature.params)
    next_action, next_log_prob = _sample_action(config, actor_net, state.actor.params, next_features, key)
    target_q = critic_net.apply(state.target_critic, batch["next_obs"], next_action)
    dtype = target_q.dtype
    next_value = jnp.min(target_q, axis=0) - alpha.astype(dtype) * next_log_prob.astype(dtype)
    target = batch["reward"].astype(dtype) + (config.gamma * batch["discount"]).astype(dtype) * next_value
    q = _differentiated(config, critic_net)(critic_params, batch["obs"], batch["action"])
    errors = q - jax.lax.stop_gradient(target)
    loss = jnp.mean(jnp.sum(jnp.square(errors), axis=0), dtype=jnp.float32)
    return loss, {"q": jnp.mean(q, dtype=jnp.float32), "target_q": jnp.mean(target, dtype=jnp.float32)}


def actor_loss(actor_params, state: SACState, features, key):
    """``(L_pi, log pi(a|s))`` of the module docstring for ``actor_params`` on the critic's ``features`` of the
    observations; what :func:`actor_update` differentiates."""
    config = state.config
    actor_net, critic_net = networks(config, state.action_dim)
    alpha = jnp.exp(state.temperature.params)
    action, log_prob = _sample_action(config, actor_net, actor_params, features, key)
    q = _differentiated(config, critic_net, SACCritic.from_features)(state.critic.params, features, action)
    dtype = q.dtype
    loss = jnp.mean(alpha.astype(dtype) * log_prob.astype(dtype) - jnp.min(q, axis=0), dtype=jnp.float32)
    return loss, log_prob


def temperature_loss(log_alpha, log_prob, target_entropy):
    """``(L_alpha, None)`` of the module docstring given the actor's ``log_prob`` (detached)."""
    entropy_gap = jax.lax.stop_gradient(-log_prob.astype(jnp.float32) - target_entropy)
    return jnp.mean(jnp.exp(log_alpha) * entropy_gap), None


def critic_update(state: SACState, batch: dict, key: jax.Array) -> tuple[SACState, dict]:
    """The critic's gradient step on ``batch`` (already augmented, for pixels), then the target networks' update.

    Unjitted (:func:`update` jits the whole step). Returns the state and float32 metrics ``critic_loss``, ``q``
    and ``target_q``. Runs under the name scopes ``critic`` and ``target`` (metadata for :mod:`lpjax.inspect`).
    """
    config = state.config
    _, critic_net = networks(config, state.action_dim)
    critic_tx = _optimizers(config)[1]
    with jax.named_scope("critic"):
        next_features = critic_net.apply(state.critic.params, batch["next_obs"], method=SACCritic.encode)
        critic, critic_value, critic_aux = gradient_step(
            state.critic, critic_tx, critic_loss, state, batch, jax.lax.stop_gradient(next_features), key
        )
    state = state.replace(critic=critic)
    with jax.named_scope("target"):
        target_critic, compensation = target_updater(config).update(
            critic.params, state.target_critic, state.target_compensation, state.step
        )
    return (
        state.replace(target_critic=target_critic, target_compensation=compensation),
        {"critic_loss": critic_value, **critic_aux},
    )


def actor_update(state: SACState, obs: jax.Array, key: jax.Array) -> tuple[SACState, dict]:
    """The actor's gradient step on observations ``obs`` (features from the critic's encoder, without gradient),
    then the temperature's step on the actor's log-probabilities.

    Unjitted (:func:`update` jits the whole step). Returns the state and float32 metrics ``actor_loss``,
    ``temperature_loss`` and ``entropy``. Runs under the name scopes ``actor`` and ``temperature``.
    """
    config = state.config
    _, critic_net = networks(config, state.action_dim)
    actor_tx, _, temperature_tx = _optimizers(config)
    features = jax.lax.stop_gradient(critic_net.apply(state.critic.params, obs, method=SACCritic.encode))
    target_entropy = -float(state.action_dim) if config.target_entropy is None else config.target_entropy
    with jax.named_scope("actor"):
        actor, actor_value, log_prob = gradient_step(state.actor, actor_tx, actor_loss, state, features, key)
    with jax.named_scope("temperature"):
        temperature, temperature_value, _ = gradient_step(
            state.temperature, temperature_tx, temperature_loss, log_prob, target_entropy
        )
    entropy = -jnp.mean(log_prob, dtype=jnp.float32)
    return (
        state.replace(actor=actor, temperature=temperature),
        {"actor_loss": actor_value, "temperature_loss": temperature_value, "entropy": entropy},
    )


def _update(state: SACState, batch: dict) -> tuple[SACState, dict]:
    config = state.config
    key, critic_key, actor_key, aug_key = jax.random.split(state.key, 4)
    if config.pixels:  # critic: augmented + original batch (paper appendix G); actor: the augmented half
        obs_key, next_key = jax.random.split(aug_key)
        augmented = dict(
            batch,
            obs=random_shift(obs_key, batch["obs"], config.augmentation_pad),
            next_obs=random_shift(next_key, batch["next_obs"], config.augmentation_pad),
        )
        critic_batch = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), augmented, batch)
        actor_obs = augmented["obs"]
    else:
        critic_batch, actor_obs = batch, batch["obs"]

    state, critic_metrics = critic_update(state, critic_batch, critic_key)
    if config.actor_update_period == 1:
        state, actor_metrics = actor_update(state, actor_obs, actor_key)
    else:
        skipped = {name: jnp.float32(jnp.nan) for name in ("actor_loss", "temperature_loss", "entropy")}
        state, actor_metrics = jax.lax.cond(
            state.step % config.actor_update_period == 0,
            lambda s: actor_update(s, actor_obs, actor_key),
            lambda s: (s, skipped),
            state,
        )

    metrics = {
        "critic_loss": critic_metrics["critic_loss"],
        "actor_loss": actor_metrics["actor_loss"],
        "temperature_loss": actor_metrics["temperature_loss"],
        "alpha": jnp.exp(state.temperature.params),
        "entropy": actor_metrics["entropy"],
        "q": critic_metrics["q"],
        "target_q": critic_metrics["target_q"],
        "critic_loss_scale": loss_scale_or_one(state.critic.opt_state),
        "actor_loss_scale": loss_scale_or_one(state.actor.opt_state),
        "critic_skipped_steps": skipped_steps(state.critic.opt_state).astype(jnp.float32),
        "actor_skipped_steps": skipped_steps(state.actor.opt_state).astype(jnp.float32),
    }
    return state.replace(step=state.step + 1, key=key), metrics


update = jax.jit(_update, donate_argnums=0)
update.__doc__ = """``update(state, batch) -> (state, metrics)``: one SAC gradient step, jitted, ``state`` donated.

``batch`` is a dict of arrays with a leading batch axis: ``obs``, ``action``, ``reward``, ``discount`` (0 at a
true terminal, 1 otherwise) and ``next_obs``. Metrics are float32 scalars (``actor_loss``, ``temperature_loss``
and ``entropy`` are nan on steps without an actor update). ``critic_loss_scale``/``actor_loss_scale`` are the
loss scales (1 without loss scaling) and ``critic_skipped_steps``/``actor_skipped_steps`` the updates each loss
scaler has skipped so far (:func:`lpjax.optim.skipped_steps`; 0 without loss scaling)."""


@functools.partial(jax.jit, static_argnames="deterministic")
def act(state: SACState, obs: jax.Array, key: jax.Array, deterministic: bool = False) -> jax.Array:
    """Actions in [-1, 1] for a batch of observations: ``tanh(mean)`` if ``deterministic``, else a sample."""
    actor_net, critic_net = networks(state.config, state.action_dim)
    features = critic_net.apply(state.critic.params, obs, method=SACCritic.encode)
    mean, log_std = actor_net.apply(state.actor.params, features)
    if deterministic:
        return jnp.tanh(mean).astype(jnp.float32)
    action, _ = sample_and_log_prob(key, mean, log_std, sigma_eps=state.config.sigma_eps)
    return action.astype(jnp.float32)
