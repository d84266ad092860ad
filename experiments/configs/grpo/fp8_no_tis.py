"""GRPO with FP8 rollouts and no importance correction (the mismatch left uncorrected)."""

from experiments.configs.grpo import _base as base


def get_config():
    config = base.get_config()
    config.agent.update(rollout_precision="fp8", kv_cache_dtype="fp8", tis=False)
    return config
