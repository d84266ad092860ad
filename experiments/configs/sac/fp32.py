"""SAC from states, fp32, no low-precision methods (the reference)."""

from experiments.configs.sac import _base as base


def get_config():
    config = base.get_config()
    config.agent.policy = "fp32"
    return config
