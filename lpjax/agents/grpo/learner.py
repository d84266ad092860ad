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

**On a device mesh** (``mesh``, a :class:`jax.sharding.Mesh` with the axes ``("data", "fsdp")`` of
:mod:`lpjax.sharding`; ``None`` runs on one device with plain arrays):

* **State (FSDP).** :func:`lpjax.sharding.place` splits every parameter with two or more axes over ``"fsdp"``, and every
  optimizer leaf shaped like it (Adam's or hAdam's moments, the Kahan compensation) the same way
  (:func:`lpjax.sharding.state_shardings`); vectors, scalars, the loss scaler's state and PRNG keys are
  replicated. So the stored state per device is about ``1 / fsdp`` of the whole. A forward pass gathers the
  parameters it uses whole onto every device (an all-gather) and the backward pass reduce-scatters the gradient
  back onto the shards (ZeRO-3), so the optimizer updates each shard where it lives.
* **Rollouts and updates (data parallel).** Every batch-shaped array (prompts, completions, rewards, advantages,
  log-probs, masks, each minibatch) has its rows split over all ``data * fsdp`` devices
  (:func:`lpjax.sharding.batch_sharding`): each device samples (:func:`sample_on_mesh`) and trains on its share
  of the sequences, and the gradient, a token mean over the whole (mini)batch, sums every device's rows. The
  rollout engine runs the training parameters as synced, so its weights are sharded like them.
* **Stable layouts.** The state leaves :func:`train_step` with the layout it came in with
  (``with_sharding_constraint`` on the carried state, in the minibatch loop too), so the jitted functions see the
  same shardings at every iteration. :func:`check_mesh` refuses a batch or minibatch the device count does not
  divide.

Everything is one SPMD program over global arrays, so every decision is global: the loss scaler's finiteness
check reads the whole gradient, and a non-finite value computed from one device's rows skips the step and backs
the scale off on every device (see :mod:`lpjax.sharding`). The result does not depend on the mesh beyond the
order of floating-point sums: prompts come from the host's ``rng`` (every process draws the same), and with
``jax_threefry_partitionable`` (JAX's default, required by :func:`check_mesh`) the sampling and shuffling keys draw
the same random bits for a sharded array as for a whole one.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding

from lpjax.agents.grpo.algorithm import group_advantages, grpo_loss, sequence_logprobs
from lpjax.agents.grpo.config import GRPOConfig
from lpjax.agents.training import Trainable, gradient_step, network_optimizer, trainable_init
from lpjax.nn.causal_lm import CausalLM, transformer_causal_lm
from lpjax.optim import loss_scale_or_one, skipped_steps
from lpjax.rollout import SamplingSettings, sample
from lpjax.sharding import batch_sharding, constrain, put_global, put_replicated, replicated


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
    train = transformer_causal_lm(dict(lm, policy=config.precision))
    rollout = transformer_causal_lm(
        dict(lm, policy=config.rollout.precision), kv_cache_dtype=config.rollout.kv_cache_dtype
    )
    return train, rollout


def init_state(params: Any, config: GRPOConfig) -> GRPOState:
    """A learner starting from ``params`` (in the training model's dtypes); with ``beta > 0`` they are also the
    KL reference policy."""
    ref = jax.tree.map(jnp.copy, params) if config.beta > 0 else None
    return GRPOState(trainable_init(params, optimizer(config)), jnp.zeros([], jnp.int32), ref)


def check_mesh(config: GRPOConfig, mesh: Mesh | None) -> None:
    """Raises ``ValueError`` (one line) unless GRPO can run data parallel on ``mesh`` (``None``: one device).

    The device count must divide the rollout batch (``num_prompts * group_size`` sequences: every device samples
    and scores the same number of them) and each minibatch, and ``jax_threefry_partitionable`` must be on (JAX's
    default; without it a sharded random draw differs from the whole one, so the run would depend on the mesh).
    A group may straddle two devices: its advantages are computed over the global batch.
    """
    if mesh is None:
        return
    devices = mesh.devices.size
    if config.batch_size % devices or config.minibatch_size % devices:
        raise ValueError(
            f"GRPO on a mesh of {devices} devices: the rollout batch (num_prompts * group_size = {config.num_prompts}"
            f" * {config.group_size} = {config.batch_size} sequences) and each of its {config.num_minibatches} "
            f"minibatch(es) ({config.minibatch_size} sequences) must be divisible by the device count."
        )
    if not jax.config.jax_threefry_partitionable:
        raise ValueError(
            "GRPO on a mesh needs jax_threefry_partitionable=True (JAX's default): otherwise random draws depend on "
            "the mesh."
        )


def rows_sharding(mesh: Mesh, rows: int) -> NamedSharding:
    """The sharding of an array of ``rows`` sequences on ``mesh``: its rows split over every device
    (:func:`lpjax.sharding.batch_sharding`) when the device count divides ``rows``, else replicated."""
    return batch_sharding(mesh) if rows % mesh.devices.size == 0 else replicated(mesh)


def _constrain_rows(tree: Any, mesh: Mesh | None) -> Any:
    """Inside ``jit``: every leaf of ``tree`` (batch-shaped arrays) with its rows split by :func:`rows_sharding`."""
    if mesh is None:
        return tree
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, rows_sharding(mesh, x.shape[0])), tree)


def _gathered(params: Any, mesh: Mesh | None) -> Any:
    """Inside ``jit``: the (fsdp-sharded) parameters whole on every device, where a forward pass uses them: an
    all-gather, whose transpose reduce-scatters the gradient back onto the shards (ZeRO-3)."""
    if mesh is None:
        return params
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, replicated(mesh)), params)


@functools.partial(jax.jit, static_argnames=("model", "settings", "mesh"))
def sample_on_mesh(
    model: Any,
    params: Any,
    prompts: jax.Array,
    key: jax.Array,
    settings: SamplingSettings,
    kv_scales: Any,
    mesh: Mesh,
) -> dict[str, jax.Array]:
    """:func:`lpjax.rollout.sample` on ``mesh``: the completions, log-probs and masks come out with their rows
    split like the prompts' (:func:`rows_sharding`), so XLA splits the prefill, the KV cache and every decoding
    step the same way and each device decodes its own prompts with the whole parameters (all-gathered from their
    fsdp shards). ``prompts``, ``key`` and ``params`` are global arrays on ``mesh``."""
    return _constrain_rows(sample(model, _gathered(params, mesh), prompts, key, settings, kv_scales), mesh)


def training_batch(task: Any, group_size: int, prompts: jax.Array, rollout: dict[str, jax.Array]) -> dict[str, Any]:
    """What an update trains on, from ``prompts (B, P)`` and their ``rollout`` (:func:`lpjax.rollout.sample`):
    ``tokens = prompt + completion (B, P + N)``, the response ``mask`` and ``logp_rollout`` aligned with ``tokens``
    (0 on the prompt), the group ``advantages (B,)`` of the task's rewards, and the batch's mean ``reward`` and
    ``response_length`` (scalars)."""
    rewards = task.rewards(prompts, rollout["completions"])
    advantages = group_advantages(rewards, group_size)
    prompt_zeros = jnp.zeros(prompts.shape, jnp.float32)
    return dict(
        tokens=jnp.concatenate([jnp.asarray(prompts, jnp.int32), rollout["completions"]], axis=1),
        mask=jnp.concatenate([prompt_zeros, rollout["mask"]], axis=1),
        logp_rollout=jnp.concatenate([prompt_zeros, rollout["logp"]], axis=1),
        advantages=advantages,
        reward=jnp.mean(rewards),
        response_length=jnp.mean(jnp.sum(rollout["mask"], axis=1)),
    )


@functools.partial(jax.jit, static_argnames=("model", "settings", "task", "group_size", "mesh"))
def _rollout_on_mesh(
    model: Any,
    settings: SamplingSettings,
    task: Any,
    group_size: int,
    mesh: Mesh,
    params: Any,
    kv_scales: Any,
    prompts: jax.Array,
    key: jax.Array,
) -> dict[str, Any]:
    """:func:`sample_on_mesh` then :func:`training_batch` in one SPMD program: the batch's arrays come out with
    their rows split over the devices, its scalars replicated."""
    batch = training_batch(
        task, group_size, prompts, sample_on_mesh(model, params, prompts, key, settings, kv_scales, mesh)
    )
    rows = {k: v for k, v in batch.items() if jnp.ndim(v) > 0}
    scalars = {k: jax.lax.with_sharding_constraint(v, replicated(mesh)) for k, v in batch.items() if jnp.ndim(v) == 0}
    return {**_constrain_rows(rows, mesh), **scalars}


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


@functools.partial(jax.jit, static_argnames=("model", "config", "mesh"))
def train_step(
    model: Any,
    config: GRPOConfig,
    state: GRPOState,
    tokens: jax.Array,
    mask: jax.Array,
    logp_rollout: jax.Array,
    advantages: jax.Array,
    key: jax.Array | None = None,
    mesh: Mesh | None = None,
) -> tuple[GRPOState, dict[str, jax.Array]]:
    """One update (see the module docstring) on ``tokens (B, T)`` with response ``mask (B, T)``, the rollout's
    log-probs ``logp_rollout (B, T)`` aligned with ``tokens`` and per-sequence ``advantages (B,)``.

    ``key`` draws the minibatch shuffles (:func:`minibatch_indices`); it is required when
    ``num_minibatches > 1``. Returns the new state and, per gradient step in order, :func:`grpo_loss`'s metrics
    and ``loss``: arrays of shape ``(ppo_epochs * num_minibatches,)``.

    On a ``mesh`` (see the module docstring) ``state`` is laid out by :func:`lpjax.sharding.place`, the batch's
    rows (and ``key``, replicated) are global arrays on it; the batch and every minibatch are constrained to rows
    split over the devices, and the state, after every gradient step and on return, to that layout.
    """
    tx = optimizer(config)

    def logprobs(params, toks):
        params = _gathered(params, mesh)
        return sequence_logprobs(model.logits(params, toks), toks, temperature=config.temperature)

    logp_ref = None if state.ref_params is None else jax.lax.stop_gradient(logprobs(state.ref_params, tokens))
    on_policy = config.ppo_epochs * config.num_minibatches == 1
    logp_old = None if on_policy else jax.lax.stop_gradient(logprobs(state.params, tokens))
    batch = dict(
        tokens=tokens, mask=mask, logp_rollout=logp_rollout, advantages=advantages, logp_old=logp_old, logp_ref=logp_ref
    )
    batch = _constrain_rows(batch, mesh)

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
        return constrain(trainable, mesh), dict(metrics, loss=loss)

    if on_policy:
        trainable, metrics = step(state.trainable, batch)
        metrics = jax.tree.map(lambda m: m[None], metrics)
    else:
        if key is None and config.num_minibatches > 1:
            raise ValueError("train_step: num_minibatches > 1 shuffles the batch; pass key.")
        indices = minibatch_indices(key, config)
        trainable, metrics = jax.lax.scan(
            lambda t, rows: step(t, _constrain_rows(jax.tree.map(lambda x: x[rows], batch), mesh)),
            state.trainable,
            indices,
        )
    return constrain(GRPOState(trainable, state.step + 1, state.ref_params), mesh), metrics


def iteration(
    train_model: Any,
    engine: Any,
    task: Any,
    config: GRPOConfig,
    state: GRPOState,
    rng: np.random.Generator,
    key: jax.Array,
    mesh: Mesh | None = None,
) -> tuple[GRPOState, dict[str, float]]:
    """Rollout -> rewards -> advantages -> update -> sync. Returns the new state and the iteration's metrics.

    ``rng`` draws the prompts; ``key`` is split into the sampling key and the minibatch shuffles' key. The
    metrics are the means over the update's gradient steps of :func:`train_step`'s (``loss``, ``pg_loss``,
    ``ppo_clip_frac``, ``ratio_mean``, the TIS and mismatch metrics, ...), ``ppo_clip_frac_last`` (at the last
    gradient step: how far the epochs moved the policy), ``loss_scale`` and ``skipped_steps`` (after the update,
    with ``methods.loss_scaling``: the scale and the gradient steps the scaler has skipped so far), the mean
    ``reward`` and ``response_length``.

    On a ``mesh`` (see the module docstring; :func:`check_mesh` first) ``state`` is laid out by
    :func:`lpjax.sharding.place` and ``engine`` holds its parameters (as synced): the prompts' rows are split over the
    devices, the rollout and the batch are one SPMD program (:func:`sample_on_mesh`, :func:`training_batch`), and
    the iteration waits for the new state and KV scales before it returns.
    """
    sample_key, shuffle_key = jax.random.split(key)
    prompts = np.repeat(task.sample_prompts(rng, config.num_prompts), config.group_size, axis=0)
    if mesh is None:
        rollout = engine.rollout(jnp.asarray(prompts), sample_key)
        batch = training_batch(task, config.group_size, jnp.asarray(prompts), rollout)
    else:
        check_mesh(config, mesh)
        if engine.params is None:
            raise RuntimeError("RolloutEngine.rollout before the first sync: call sync(params, ...) first.")
        sample_key, shuffle_key = put_replicated((sample_key, shuffle_key), mesh)
        batch = _rollout_on_mesh(
            engine.model,
            engine.settings,
            task,
            config.group_size,
            mesh,
            engine.params,
            engine.kv_scales,
            put_global(prompts, batch_sharding(mesh)),
            sample_key,
        )
    state, metrics = train_step(
        train_model,
        config,
        state,
        batch["tokens"],
        batch["mask"],
        batch["logp_rollout"],
        batch["advantages"],
        shuffle_key,
        mesh=mesh,
    )
    engine.sync(state.params, int(state.step), batch["tokens"])
    if mesh is not None:  # XLA:CPU collectives can time out behind a deep queue of asynchronous dispatches
        jax.block_until_ready((state, engine.kv_scales))
    out = {k: float(jnp.mean(v)) for k, v in metrics.items()}
    out["ppo_clip_frac_last"] = float(metrics["ppo_clip_frac"][-1])
    if config.methods.loss_scaling:
        out["loss_scale"] = float(loss_scale_or_one(state.trainable.opt_state))
        out["skipped_steps"] = float(skipped_steps(state.trainable.opt_state))
    out.update(reward=float(batch["reward"]), response_length=float(batch["response_length"]))
    return state, out
