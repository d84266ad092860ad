"""GRPO with fp32 rollout GEMMs and only the KV cache in FP8 (scales recalibrated after every update), TIS on."""

from experiments.configs.grpo import _base as base


def get_config():
    config = base.get_config()
    config.agent.rollout.update(policy="fp32", kv_cache_dtype="fp8")
    return config
