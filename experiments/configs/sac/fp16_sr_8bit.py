"""SAC from states, pure fp16 with stochastic rounding and 8-bit optimizer moments.

``fp16_sr.py`` with hAdam's moments ``m`` and ``w`` stored blockwise-quantized in 8 bits
(``agent.methods.moment_dtype = "fp8"``: float8 e4m3 codes with one float32 scale per block of
``moment_block_size`` elements; :mod:`lpjax.optim.quantized_moments`).
"""

from experiments.configs.sac import fp16_sr


def get_config():
    config = fp16_sr.get_config()
    config.agent.methods.moment_dtype = "fp8"
    return config
