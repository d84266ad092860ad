"""One GRPO iteration on a verifiable task: roll out G completions per prompt with the rollout engine, score
them exactly, compute group-relative advantages, take a gradient step of the TIS-corrected GRPO loss, and sync
the new weights back into the rollout engine.

The training model computes ``logp_new`` (float32 log-softmax of its logits, :func:`sequence_logprobs`) over
``prompt + completion``; the loss mask covers the completion tokens up to and including EOS. One update per
rollout batch (``ppo_epochs = 1``), so ``logp_old = stop_gradient(logp_new)`` and the PPO ratio is 1 at the
update; the TIS weight ``min(exp(logp_old - logp_rollout), C)`` carries the rollout/training mismatch.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lpjax.agents.grpo.algorithm import group_advantages, grpo_loss, sequence_logprobs
from lpjax.agents.grpo.config import GRPOConfig


class GRPOState(NamedTuple):
    """The learner's parameters, optimizer state and update count, and the frozen reference parameters of the
    per-token KL penalty (``None`` when ``beta == 0``)."""

    params: Any
    opt_state: Any
    step: jax.Array
    ref_params: Any = None


def optimizer(config: GRPOConfig) -> optax.GradientTransformation:
    """AdamW after global-norm clipping (``max_grad_norm``)."""
    adam = optax.adamw(config.learning_rate, config.b1, config.b2, config.adam_eps,
                       weight_decay=config.weight_decay)
    if config.max_grad_norm is None:
        return adam
    return optax.chain(optax.clip_by_global_norm(config.max_grad_norm), adam)


def init_state(params: Any, config: GRPOConfig) -> GRPOState:
    """A learner starting from ``params``; with ``beta > 0`` they are also the KL reference policy."""
    ref = jax.tree.map(jnp.copy, params) if config.beta > 0 else None
    return GRPOState(params, optimizer(config).init(params), jnp.zeros([], jnp.int32), ref)


@functools.partial(jax.jit, static_argnames=("model", "config"))
def train_step(model: Any, config: GRPOConfig, state: GRPOState, tokens: jax.Array, mask: jax.Array,
               logp_rollout: jax.Array, advantages: jax.Array) -> tuple[GRPOState, dict[str, jax.Array]]:
    """One gradient step of :func:`grpo_loss` on ``tokens (B, T)`` with response ``mask (B, T)``."""

    logp_ref = None
    if state.ref_params is not None:
        ref_logits = model.logits(state.ref_params, tokens)
        logp_ref = jax.lax.stop_gradient(sequence_logprobs(ref_logits, tokens, temperature=config.temperature))

    def loss_fn(params):
        logits = model.logits(params, tokens)
        logp = sequence_logprobs(logits, tokens, temperature=config.temperature)
        return grpo_loss(logp, logp, logp_rollout, advantages, mask, logp_ref=logp_ref, **config.loss_kwargs())

    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = optimizer(config).update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return GRPOState(params, opt_state, state.step + 1, state.ref_params), dict(metrics, loss=loss)


def iteration(train_model: Any, engine: Any, task: Any, config: GRPOConfig, state: GRPOState,
              rng: np.random.Generator, key: jax.Array) -> tuple[GRPOState, dict[str, float]]:
    """Rollout -> rewards -> advantages -> update -> sync. Returns the new state and the iteration's metrics."""
    prompts = np.repeat(task.sample_prompts(rng, config.num_prompts), config.group_size, axis=0)
    rollout = engine.rollout(jnp.asarray(prompts), key)
    rewards = task.rewards(jnp.asarray(prompts), rollout["completions"])
    advantages = group_advantages(rewards, config.group_size)
    prompt_zeros = jnp.zeros(prompts.shape, jnp.float32)
    tokens = jnp.concatenate([jnp.asarray(prompts, jnp.int32), rollout["completions"]], axis=1)
    mask = jnp.concatenate([prompt_zeros, rollout["mask"]], axis=1)
    logp_rollout = jnp.concatenate([prompt_zeros, rollout["logp"]], axis=1)
    state, metrics = train_step(train_model, config, state, tokens, mask, logp_rollout, advantages)
    engine.sync(state.params, int(state.step), tokens)
    out = {k: float(v) for k, v in metrics.items()}
    out.update(reward=float(jnp.mean(rewards)), response_length=float(jnp.mean(jnp.sum(rollout["mask"], axis=1))))
    return state, out
