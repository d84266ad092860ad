"""SAC from states, pure fp16: stochastic rounding for the parameter updates, Kahan for the target updates.

``fp16_sr.py`` with the target (Polyak) update Kahan-compensated again (``kahan_momentum``): of the two updates,
only the parameters' is rounded stochastically. With ``fp16_sr_target.py`` it tells which update's rounding
noise matters (``python -m benchmarks.sac_reproduction --configs rounding``).
"""

from experiments.configs.sac import fp16_sr


def get_config():
    config = fp16_sr.get_config()
    config.agent.methods.kahan_momentum = True
    return config
