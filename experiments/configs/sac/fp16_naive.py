"""SAC from states, pure fp16 with none of the paper's methods (the baseline that fails)."""

from experiments.configs.sac import _base as base


def get_config():
    config = base.get_config()
    config.agent.policy = "fp16"
    return config
