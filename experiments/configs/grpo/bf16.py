"""GRPO with bf16 rollouts (bf16 activations, GEMMs and KV cache, fp32 weights), TIS on."""

from experiments.configs.grpo import _base as base


def get_config():
    config = base.get_config()
    config.agent.rollout.update(policy="mixed_bf16", kv_cache_dtype="bf16")
    return config
