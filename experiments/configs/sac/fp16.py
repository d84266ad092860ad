"""SAC from states, pure fp16 with all six methods of the paper (hAdam, compound loss scaling, Kahan-gradients, Kahan-momentum, softplus-fix, normal-fix)."""

from experiments.configs.sac import _base as base


def get_config():
    config = base.get_config()
    config.agent.policy = "fp16"
    config.agent.update(base.ALL_METHODS)
    return config
