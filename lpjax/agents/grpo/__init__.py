"""GRPO for language models with rollout-mismatch corrections (FP8-RL's token-level truncated importance
sampling, sequence-level masked importance sampling, geometric-mean rejection), as pure functions.

    advantages = lpjax.agents.grpo.group_advantages(rewards, config.group_size)          # (B,)
    logp_new = lpjax.agents.grpo.sequence_logprobs(logits, tokens, temperature=config.temperature)
    loss, metrics = lpjax.agents.grpo.grpo_loss(logp_new, logp_old, logp_rollout, advantages, response_mask,
                                                **config.loss_kwargs())

The maths is model-agnostic: it sees per-token log-probabilities only (see :mod:`lpjax.agents.grpo.algorithm`).
:class:`GRPOConfig` holds the hyper-parameters, the training precision and the rollout precision
(:class:`RolloutConfig`, presets :data:`ROLLOUT_PRESETS`); :mod:`lpjax.agents.grpo.learner` runs the iterations
(rollout, rewards, PPO epochs of minibatch updates, weight sync), on one device or on a ``("data", "fsdp")`` device
mesh (:func:`lpjax.sharding.place`, :func:`check_mesh`: the state split over ``"fsdp"``, the rollout and the update data
parallel).
"""

from lpjax.agents.grpo.algorithm import (
    ADVANTAGE_EPS,
    CLIP_HIGHER_EPS,
    MAX_LOG_RATIO,
    ROLLOUT_CORRECTIONS,
    geometric_rejection_weights,
    group_advantages,
    grpo_loss,
    mis_weights,
    sequence_logprobs,
    tis_weights,
)
from lpjax.agents.grpo.config import ROLLOUT_PRESETS, GRPOConfig, RolloutConfig
from lpjax.agents.grpo.learner import (
    GRPOState,
    check_mesh,
    init_state,
    iteration,
    minibatch_indices,
    optimizer,
    rows_sharding,
    sample_on_mesh,
    train_step,
    training_batch,
    transformer_models,
)

__all__ = [
    "ADVANTAGE_EPS",
    "CLIP_HIGHER_EPS",
    "MAX_LOG_RATIO",
    "ROLLOUT_CORRECTIONS",
    "geometric_rejection_weights",
    "mis_weights",
    "ROLLOUT_PRESETS",
    "GRPOConfig",
    "GRPOState",
    "RolloutConfig",
    "check_mesh",
    "group_advantages",
    "grpo_loss",
    "init_state",
    "iteration",
    "minibatch_indices",
    "optimizer",
    "rows_sharding",
    "sample_on_mesh",
    "sequence_logprobs",
    "tis_weights",
    "train_step",
    "training_batch",
    "transformer_models",
]
