"""SAC from pixels in fp32, the reference for ``pixels.py`` (same hyper-parameters, no fp16 methods)."""

from experiments.configs.sac import pixels
from lpjax.methods import PrecisionMethods


def get_config():
    config = pixels.get_config()
    config.agent.update(policy="fp32", weight_standardization=False, encoder_clip=None)
    config.agent.methods.update(dict.fromkeys(PrecisionMethods.switches(), False))
    return config
