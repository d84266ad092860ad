"""GRPO with fp32 rollouts and fp32 training (the reference)."""

from experiments.configs.grpo import _base as base


def get_config():
    return base.get_config()
