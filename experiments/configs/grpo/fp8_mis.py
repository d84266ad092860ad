"""GRPO with FP8 rollouts (W8A8 E4M3 GEMMs and an fp8 KV cache) and sequence-level masked importance sampling
(MIS: a sequence's ratio as its weight, sequences with a ratio above ``mis_cap`` = 2 dropped) instead of TIS."""

from experiments.configs.grpo import fp8_tis as base


def get_config():
    config = base.get_config()
    config.agent.rollout_correction = "mis"
    return config
