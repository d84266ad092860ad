"""One GRPO iteration on a verifiable task: roll out G completions per prompt with the rollout engine, score
them exactly, compute group-relative advantages over the whole batch, update the training model with PPO epochs
of minibatch gradient steps of the TIS-corrected GRPO loss, and sync the new weights into the rollout engine.

The update (:func:`train_step`) on a batch of ``B`` sequences ``tokens = prompt + completion``, whose loss mask
covers the completion tokens up to and including EOS:

1. ``logp_old = sequence_logprobs(train_model(params_0))`` once for the whole batch, without gradient (and
   ``logp_ref`` under the frozen reference parameters when ``beta > 0``); log-probs are float32 whatever the
   training policy.
2. For each of ``ppo_epochs`` epochs, a permutation of the ``B`` sequences (drawn from the iteration's key) is
   cut into ``num_minibatches`` minibatches of ``B / num_minibatches`` sequences, and each minibatch takes one
   :func:`lpjax.agents.training.gradient_step` of
   ``grpo_loss(logp_new, logp_old, logp_rollout, advantages, mask)`` (loss-scaled gradients when
   ``methods.loss_scaling``), the token mean taken over the minibatch's response tokens.

Sequences are shuffled individually, not by group: the advantages are computed over the full batch before the
update, so a minibatch needs no complete group. At the first gradient step ``params = params_0``, so the PPO
ratio is 1 and nothing is clipped; later steps are off-policy and the clip bounds how far they move. The TIS
weight ``min(exp(logp_old - logp_rollout), C)`` stays fixed over the epochs: it corrects the engine mismatch of
the sampled data, the ratio the policy's own change.

With ``ppo_epochs = num_minibatches = 1`` (the default: one on-policy update per rollout batch) the only step is
at ``params_0``, so ``logp_old`` is ``logp_new`` itself (``grpo_loss`` stops its gradient) and one training forward
pass suffices.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lpjax.agents.grpo.algorithm import group_advantages, grpo_loss, sequence_logprobs
from lpjax.agents.grpo.config import GRPOConfig
from lpjax.agents.training import Trainable, gradient_step, network_optimizer, trainable_init
from lpjax.nn.causal_lm import CausalLM, transformer_causal_lm
from lpjax.optim import loss_scale_or_one


class GRPOState(NamedTuple):
    """The learner's state.

    Attributes:
      trainable: the training model's parameters and optimizer state (:class:`lpjax.agents.training.Trainable`).
      step: the number of updates (iterations) taken, int32; each is ``ppo_epochs * num_minibatches`` gradient
        steps.
      ref_params: the frozen reference parameters of the KL penalty (``None`` when ``beta == 0``).
    """

    trainable: Trainable
    step: jax.Array
    ref_params: Any = None

    @property
    def params(self) -> Any:
        """The training model's current parameters."""
        return self.trainable.params


def optimizer(config: GRPOConfig) -> optax.GradientTransformation:
    """The training model's optimizer: :func:`lpjax.agents.training.network_optimizer` at ``learning_rate`` with
    ``weight_decay`` and ``max_grad_norm``."""
    return network_optimizer(
        config.learning_rate, config, weight_decay=config.weight_decay, max_grad_norm=config.max_grad_norm
    )


def transformer_models(lm: Mapping[str, Any], config: GRPOConfig) -> tuple[CausalLM, CausalLM]:
    """``(train_model, rollout_model)``: :class:`lpjax.nn.TransformerLM` with the fields ``lm`` (``vocab_size``,
    ``num_layers``, ..., no ``policy``) in the training precision ``config.policy`` and in the rollout precision
    ``config.rollout`` (its policy and KV-cache dtype). Both have the same parameter tree: the training model's
    ``init`` initialises the parameters both run."""
    lm = dict(lm)
    train = transformer_causal_lm(dict(lm, policy=config.policy))
    rollout = transformer_causal_lm(dict(lm, policy=config.rollout.policy), kv_dtype=config.rollout.kv_cache_dtype)
    return train, rollout


def init_state(params: Any, config: GRPOConfig) -> GRPOState:
    """A learner starting from ``params`` (in the training model's dtypes); with ``beta > 0`` they are also the
    KL reference policy."""
    ref = jax.tree.map(jnp.copy, params) if config.beta > 0 else None
    return GRPOState(trainable_init(params, optimizer(config)), jnp.zeros([], jnp.int32), ref)


def minibatch_indices(key: jax.Array | None, config: GRPOConfig) -> jax.Array:
    """The sequences of every gradient step of one update: ``(ppo_epochs * num_minibatches, minibatch_size)`` int32.

    Epoch ``e`` is ``permutation(split(key, ppo_epochs)[e], batch_size)`` cut into ``num_minibatches`` consecutive
    rows, so each epoch visits every sequence once. With one minibatch there is nothing to shuffle: every epoch is
    ``arange(batch_size)`` and ``key`` may be ``None``.
    """
    epochs, size = config.ppo_epochs, config.batch_size
    if config.num_minibatches == 1:
        return jnp.broadcast_to(jnp.arange(size, dtype=jnp.int32), (epochs, size))
    orders = jax.vmap(lambda k: jax.random.permutation(k, size))(jax.random.split(key, epochs))
    return orders.astype(jnp.int32).reshape(epochs * config.num_minibatches, config.minibatch_size)


@functools.partial(jax.jit, static_argnames=("model", "config"))
def train_step(
    model: Any,
    config: GRPOConfig,
    state: GRPOState,
    tokens: jax.Array,
    mask: jax.Array,
    logp_rollout: jax.Array,
    advantages: jax.Array,
    key: jax.Array | None = None,
) -> tuple[GRPOState, dict[str, jax.Array]]:
    """One update (see the module docstring) on ``tokens (B, T)`` with response ``mask (B, T)``, the rollout's
    log-probs ``logp_rollout (B, T)`` aligned with ``tokens`` and per-sequence ``advantages (B,)``.

    ``key`` draws the minibatch shuffles (:func:`minibatch_indices`); it is required when
    ``num_minibatches > 1``. Returns the new state and, per gradient step in order, :func:`grpo_loss`'s metrics
    and ``loss``: arrays of shape ``(ppo_epochs * num_minibatches,)``.
    """
    tx = optimizer(config)

    def logprobs(params, toks):
        return sequence_logprobs(model.logits(params, toks), toks, temperature=config.temperature)

    logp_ref = None if state.ref_params is None else jax.lax.stop_gradient(logprobs(state.ref_params, tokens))
    on_policy = config.ppo_epochs * config.num_minibatches == 1
    logp_old = None if on_policy else jax.lax.stop_gradient(logprobs(state.params, tokens))
    batch = dict(
        tokens=tokens, mask=mask, logp_rollout=logp_rollout, advantages=advantages, logp_old=logp_old, logp_ref=logp_ref
    )

    def loss_fn(params, minibatch):
        logp = logprobs(params, minibatch["tokens"])
        old = logp if minibatch["logp_old"] is None else minibatch["logp_old"]
        return grpo_loss(
            logp,
            old,
            minibatch["logp_rollout"],
            minibatch["advantages"],
            minibatch["mask"],
            logp_ref=minibatch["logp_ref"],
            **config.loss_kwargs(),
        )

    def step(trainable, minibatch):
        trainable, loss, metrics = gradient_step(trainable, tx, loss_fn, minibatch)
        return trainable, dict(metrics, loss=loss)

    if on_policy:
        trainable, metrics = step(state.trainable, batch)
        metrics = jax.tree.map(lambda m: m[None], metrics)
    else:
        if key is None and config.num_minibatches > 1:
            raise ValueError("train_step: num_minibatches > 1 shuffles the batch; pass key.")
        indices = minibatch_indices(key, config)
        trainable, metrics = jax.lax.scan(
            lambda t, rows: step(t, jax.tree.map(lambda x: x[rows], batch)), state.trainable, indices
        )
    return GRPOState(trainable, state.step + 1, state.ref_params), metrics


def iteration(
    train_model: Any,
    engine: Any,
    task: Any,
    config: GRPOConfig,
    state: GRPOState,
    rng: np.random.Generator,
    key: jax.Array,
) -> tuple[GRPOState, dict[str, float]]:
    """Rollout -> rewards -> advantages -> update -> sync. Returns the new state and the iteration's metrics.

    ``rng`` draws the prompts; ``key`` is split into the sampling key and the minibatch shuffles' key. The
    metrics are the means over the update's gradient steps of :func:`train_step`'s (``loss``, ``pg_loss``,
    ``ppo_clip_frac``, ``ratio_mean``, the TIS and mismatch metrics, ...), ``ppo_clip_frac_last`` (at the last
    gradient step: how far the epochs moved the policy), ``loss_scale`` (after the update, with
    ``methods.loss_scaling``), the mean ``reward`` and ``response_length``.
    """
    sample_key, shuffle_key = jax.random.split(key)
    prompts = np.repeat(task.sample_prompts(rng, config.num_prompts), config.group_size, axis=0)
    rollout = engine.rollout(jnp.asarray(prompts), sample_key)
    rewards = task.rewards(jnp.asarray(prompts), rollout["completions"])
    advantages = group_advantages(rewards, config.group_size)
    prompt_zeros = jnp.zeros(prompts.shape, jnp.float32)
    tokens = jnp.concatenate([jnp.asarray(prompts, jnp.int32), rollout["completions"]], axis=1)
    mask = jnp.concatenate([prompt_zeros, rollout["mask"]], axis=1)
    logp_rollout = jnp.concatenate([prompt_zeros, rollout["logp"]], axis=1)
    state, metrics = train_step(train_model, config, state, tokens, mask, logp_rollout, advantages, shuffle_key)
    engine.sync(state.params, int(state.step), tokens)
    out = {k: float(jnp.mean(v)) for k, v in metrics.items()}
    out["ppo_clip_frac_last"] = float(metrics["ppo_clip_frac"][-1])
    if config.methods.loss_scaling:
        out["loss_scale"] = float(loss_scale_or_one(state.trainable.opt_state))
    out.update(reward=float(jnp.mean(rewards)), response_length=float(jnp.mean(jnp.sum(rollout["mask"], axis=1))))
    return state, out
