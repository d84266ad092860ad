"""GRPO for language models with FP8-RL's token-level truncated importance sampling, as pure functions.

    advantages = lpjax.agents.grpo.group_advantages(rewards, config.group_size)          # (B,)
    logp_new = lpjax.agents.grpo.sequence_logprobs(logits, tokens, temperature=config.temperature)
    loss, metrics = lpjax.agents.grpo.grpo_loss(logp_new, logp_old, logp_rollout, advantages, response_mask,
                                                **config.loss_kwargs())

The maths is model-agnostic: it sees per-token log-probabilities only (see :mod:`lpjax.agents.grpo.algorithm`).
"""

from lpjax.agents.grpo.algorithm import (
    ADVANTAGE_EPS,
    CLIP_HIGHER_EPS,
    MAX_LOG_RATIO,
    group_advantages,
    grpo_loss,
    sequence_logprobs,
    tis_weights,
)
from lpjax.agents.grpo.config import KV_CACHE_DTYPES, ROLLOUT_PRECISIONS, GRPOConfig
from lpjax.agents.grpo.learner import GRPOState, init_state, iteration, train_step

__all__ = ["ADVANTAGE_EPS", "CLIP_HIGHER_EPS", "KV_CACHE_DTYPES", "MAX_LOG_RATIO", "ROLLOUT_PRECISIONS", "GRPOConfig",
           "GRPOState", "group_advantages", "init_state", "iteration", "train_step", "grpo_loss", "sequence_logprobs", "tis_weights"]
