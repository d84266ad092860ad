"""SAC from states, pure fp16: Kahan for the parameter updates, stochastic rounding for the target updates.

``fp16_sr.py`` with the parameter updates Kahan-compensated again (``kahan_gradients``): of the two updates,
only the target's (Polyak) is rounded stochastically. The counterpart of ``fp16_sr_params.py``.
"""

from experiments.configs.sac import fp16_sr


def get_config():
    config = fp16_sr.get_config()
    config.agent.methods.kahan_gradients = True
    return config
