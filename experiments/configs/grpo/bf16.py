"""GRPO with bf16 rollouts (bf16 activations and KV cache, fp32 weights), TIS on."""

from experiments.configs.grpo import _base as base


def get_config():
    config = base.get_config()
    config.agent.rollout_precision = "bf16"
    return config
