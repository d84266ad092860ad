"""GRPO with fp32 rollout GEMMs and only the KV cache in FP8 (scales recalibrated after every update), TIS on."""

from experiments.configs.grpo import _base as base


def get_config():
    config = base.get_config()
    config.agent.update(rollout_precision="fp8_kv", kv_cache_dtype="fp8", tis=True)
    return config
