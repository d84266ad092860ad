"""GRPO with FP8 rollouts (W8A8 E4M3 GEMMs and an fp8 KV cache) and no importance correction (the mismatch left
uncorrected)."""

from experiments.configs.grpo import _base as base


def get_config():
    config = base.get_config()
    config.agent.rollout.update(policy="fp8", kv_cache_dtype="fp8")
    config.agent.rollout_correction = "none"
    return config
