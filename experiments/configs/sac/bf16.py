"""SAC from states, pure bfloat16.

bf16 has float32's range, so loss scaling and the overflow fixes are not needed; its 8-bit mantissa makes Kahan
summation matter more than in fp16.
"""

from experiments.configs.sac import _base as base


def get_config():
    config = base.get_config()
    config.agent.policy = "bf16"
    config.agent.methods.update(kahan_gradients=True, kahan_momentum=True)
    return config
