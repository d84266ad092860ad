"""SAC from states, pure fp16 with all six methods of the paper.

hAdam, compound loss scaling, Kahan-gradients, Kahan-momentum, softplus-fix and normal-fix.
"""

import dataclasses

from experiments.configs.sac import _base as base
from lpjax.methods import PrecisionMethods


def get_config():
    config = base.get_config()
    config.agent.policy = "fp16"
    config.agent.methods.update(dataclasses.asdict(PrecisionMethods.paper()))
    return config
