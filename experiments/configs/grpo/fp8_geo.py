"""GRPO with FP8 rollouts (W8A8 E4M3 GEMMs and an fp8 KV cache) and geometric-mean rejection instead of TIS:
sequences whose geometric-mean token ratio leaves [1 / 1.5, 1.5], or with a token ratio below 1e-4, are dropped."""

from experiments.configs.grpo import fp8_tis as base


def get_config():
    config = base.get_config()
    config.agent.rollout_correction = "geo_reject"
    return config
